"""Synthetic GGUFs that llama-server loads, for placement runs (generated at run time, never committed).

    python tests/synthetic_gguf.py tiny-moe OUT.gguf TOKENIZER.gguf
    python tests/synthetic_gguf.py wide-llama OUT.gguf TOKENIZER.gguf

- ``tiny-moe``: qwen3moe with random F16 weights: 12 blocks of 16 experts (4 used per token, FFN width
  256), grouped-query attention (8 heads, 2 KV heads of 64), an untied output matrix; about 250 MiB.
  Like real Qwen3 MoE GGUFs, ``feed_forward_length`` is the dense width (experts used × 256) and
  ``expert_feed_forward_length`` the experts' own.
- ``wide-llama``: llama with Llama 3 8B's widths (hidden 4096, FFN 14336, 32 heads, 8 KV heads of 128)
  but 4 blocks, Q8_0 zeros; about 1.3 GiB. Compute buffers scale with the widths, not the depth.

Both copy the tokenizer and chat template from another GGUF (SmolLM2's, 49,152 tokens). The answers
are noise; the buffers llama.cpp allocates are real, which is all the placement benchmark needs.

    python tests/synthetic_gguf.py gemma4-31b-shapes OUT.gguf
    python tests/synthetic_gguf.py llama-70b-shapes OUT.gguf

- Shape-only GGUFs for planning tests: a real model's header and tensor table in a Q4_K_M mix, the
  data section a sparse hole (no disk used, nothing llama.cpp can run): Gemma 4 31B (per-layer KV
  heads and sliding pattern) and Llama 3 70B.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

TINY_MOE = {"layers": 12, "embd": 512, "heads": 8, "kv_heads": 2, "head_dim": 64, "experts": 16, "used": 4, "ff": 256}
WIDE_LLAMA = {"layers": 4, "embd": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ff": 14336}
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)


def _writer(out: Path, arch: str, name: str, tokenizer_gguf: Path) -> tuple[gguf.GGUFWriter, int]:
    """A writer with the tokenizer of ``tokenizer_gguf`` copied in; (writer, vocabulary size)."""
    reader = gguf.GGUFReader(str(tokenizer_gguf))
    tokens = reader.get_field("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{tokenizer_gguf} has no tokenizer")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(name)
    for key in _TOKENIZER_KEYS:
        field = reader.get_field(key)
        if field is None:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    return writer, len(tokens.contents())


def _attention_shape(writer: gguf.GGUFWriter, shape: dict[str, int], context: int) -> None:
    writer.add_block_count(shape["layers"])
    writer.add_context_length(context)
    writer.add_embedding_length(shape["embd"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)


def _finish(writer: gguf.GGUFWriter, out: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def make_tiny_moe(out: Path, tokenizer_gguf: Path, seed: int = 0) -> Path:
    """Write the tiny qwen3moe GGUF to ``out`` (overwritten) and return it."""
    s = TINY_MOE
    writer, vocab = _writer(out, "qwen3moe", "tiny-qwen3moe-random", tokenizer_gguf)
    _attention_shape(writer, s, 8192)
    writer.add_feed_forward_length(s["ff"] * s["used"])
    writer.add_expert_count(s["experts"])
    writer.add_expert_used_count(s["used"])
    writer.add_expert_feed_forward_length(s["ff"])
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(seed)

    def matrix(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    embd, q_dim, kv_dim = s["embd"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    writer.add_tensor("token_embd.weight", matrix(vocab, embd))
    writer.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    writer.add_tensor("output.weight", matrix(vocab, embd))
    for layer in range(s["layers"]):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(embd, dtype=np.float32))
        writer.add_tensor(prefix + "attn_q.weight", matrix(q_dim, embd))
        writer.add_tensor(prefix + "attn_k.weight", matrix(kv_dim, embd))
        writer.add_tensor(prefix + "attn_v.weight", matrix(kv_dim, embd))
        writer.add_tensor(prefix + "attn_output.weight", matrix(embd, q_dim))
        writer.add_tensor(prefix + "attn_q_norm.weight", np.ones(s["head_dim"], dtype=np.float32))
        writer.add_tensor(prefix + "attn_k_norm.weight", np.ones(s["head_dim"], dtype=np.float32))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(embd, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_gate_inp.weight", matrix(s["experts"], embd).astype(np.float32))
        writer.add_tensor(prefix + "ffn_gate_exps.weight", matrix(s["experts"], s["ff"], embd))
        writer.add_tensor(prefix + "ffn_up_exps.weight", matrix(s["experts"], s["ff"], embd))
        writer.add_tensor(prefix + "ffn_down_exps.weight", matrix(s["experts"], embd, s["ff"]))
    return _finish(writer, out)


def make_wide_llama(out: Path, tokenizer_gguf: Path) -> Path:
    """Write the wide 4-block llama GGUF (Q8_0 zeros) to ``out`` (overwritten) and return it."""
    s = WIDE_LLAMA
    writer, vocab = _writer(out, "llama", "wide-llama-8b-widths-zeros", tokenizer_gguf)
    _attention_shape(writer, s, 8192)
    writer.add_feed_forward_length(s["ff"])
    writer.add_rope_dimension_count(s["head_dim"])
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    q8_0 = gguf.GGMLQuantizationType.Q8_0

    def zeros(rows: int, cols: int) -> np.ndarray:
        return np.zeros((rows, cols // 32 * 34), dtype=np.uint8)  # Q8_0: 34 bytes per 32 weights

    embd, q_dim, kv_dim, ff = s["embd"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["ff"]
    writer.add_tensor("token_embd.weight", zeros(vocab, embd), raw_dtype=q8_0)
    writer.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    writer.add_tensor("output.weight", zeros(vocab, embd), raw_dtype=q8_0)
    for layer in range(s["layers"]):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(embd, dtype=np.float32))
        writer.add_tensor(prefix + "attn_q.weight", zeros(q_dim, embd), raw_dtype=q8_0)
        writer.add_tensor(prefix + "attn_k.weight", zeros(kv_dim, embd), raw_dtype=q8_0)
        writer.add_tensor(prefix + "attn_v.weight", zeros(kv_dim, embd), raw_dtype=q8_0)
        writer.add_tensor(prefix + "attn_output.weight", zeros(embd, q_dim), raw_dtype=q8_0)
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(embd, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_gate.weight", zeros(ff, embd), raw_dtype=q8_0)
        writer.add_tensor(prefix + "ffn_up.weight", zeros(ff, embd), raw_dtype=q8_0)
        writer.add_tensor(prefix + "ffn_down.weight", zeros(embd, ff), raw_dtype=q8_0)
    return _finish(writer, out)


# Shape-only GGUFs: the header and tensor table of a real model's layout, the data section a sparse hole
# (no disk used). llama.cpp cannot run them; the planner reads nothing else, so tests plan real sizes.
GEMMA4_31B = {
    "layers": 60,
    "embd": 5376,
    "heads": 32,
    "kv_heads": 16,
    "head_dim": 256,
    "global_kv_heads": 4,
    "global_head_dim": 512,
    "ff": 21504,
    "vocab": 262144,
    "window": 1024,
    "context": 262144,
    "full_every": 6,
}  # fmt: skip  (google/gemma-4-31B-it config.json: 50 sliding layers, 10 full; K = V on the full ones)
LLAMA_8B = {"layers": 32, "embd": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ff": 14336, "vocab": 128256}
LLAMA_70B = {"layers": 80, "embd": 8192, "heads": 64, "kv_heads": 8, "head_dim": 128, "ff": 28672, "vocab": 128256}
# Phi-3-mini-128k's widths (LongRoPE from 4,096), laid out as a llama (no fused QKV): for planning tests
PHI3_MINI = {"layers": 32, "embd": 3072, "heads": 32, "kv_heads": 32, "head_dim": 96, "ff": 8192, "vocab": 32064}
_Q4_K, _Q6_K = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
_SHAPE_ONLY = np.dtype(np.float32)  # the element shape is given; the type is raw_dtype's


def _shape_tensor(writer: gguf.GGUFWriter, name: str, rows: int, cols: int, kind: gguf.GGMLQuantizationType) -> None:
    """One tensor's table entry (``rows`` × ``cols`` weights of ``kind``), without data."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    nbytes = rows * cols // block * size
    writer.add_tensor_info(name, (rows, cols), _SHAPE_ONLY, nbytes, raw_dtype=kind)


def _finish_shapes(writer: gguf.GGUFWriter, out: Path) -> Path:
    """Write the header and tensor table, then extend the file over the (sparse) data section."""
    writer.write_header_to_file(out)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    data = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, writer.data_alignment) for ti in writer.tensors[0].values())
    writer.close()
    header = out.stat().st_size
    with out.open("r+b") as handle:
        handle.truncate(gguf.GGUFWriter.ggml_pad(header, writer.data_alignment) + data)
    return out


def _q4_k_m_block(
    writer: gguf.GGUFWriter, layer: int, layers: int, embd: int, q: int, kv: int, ff: int, v: bool = True
) -> None:
    """One block in llama.cpp's Q4_K_M mix: Q4_K, with V and the FFN's down projection in Q6_K in the
    first and last eighth of the blocks and every third between (``use_more_bits``), else Q4_K."""
    prefix = f"blk.{layer}."
    more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    wide = _Q6_K if more_bits else _Q4_K
    writer.add_tensor_info(prefix + "attn_norm.weight", (embd,), np.dtype(np.float32), embd * 4)
    _shape_tensor(writer, prefix + "attn_q.weight", q, embd, _Q4_K)
    _shape_tensor(writer, prefix + "attn_k.weight", kv, embd, _Q4_K)
    if v:
        _shape_tensor(writer, prefix + "attn_v.weight", kv, embd, wide)
    _shape_tensor(writer, prefix + "attn_output.weight", embd, q, _Q4_K)
    writer.add_tensor_info(prefix + "ffn_norm.weight", (embd,), np.dtype(np.float32), embd * 4)
    _shape_tensor(writer, prefix + "ffn_gate.weight", ff, embd, _Q4_K)
    _shape_tensor(writer, prefix + "ffn_up.weight", ff, embd, _Q4_K)
    _shape_tensor(writer, prefix + "ffn_down.weight", embd, ff, wide)


def make_gemma4_31b_shapes(out: Path) -> Path:
    """Gemma 4 31B in Q4_K_M, shapes only (about 17.4 GiB apparent, nothing on disk), with the
    per-layer metadata convert_hf_to_gguf.py writes for it: ``sliding_window_pattern`` (booleans),
    ``head_count_kv`` (16 sliding, 4 full), ``key_length``/``value_length`` 512, ``*_swa`` 256."""
    s = GEMMA4_31B
    writer = gguf.GGUFWriter(str(out), "gemma4")
    writer.add_name("gemma-4-31b-q4_k_m-shapes")
    sliding = [layer % s["full_every"] != s["full_every"] - 1 for layer in range(s["layers"])]
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["embd"])
    writer.add_feed_forward_length(s["ff"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv([s["kv_heads"] if swa else s["global_kv_heads"] for swa in sliding])
    writer.add_key_length(s["global_head_dim"])
    writer.add_value_length(s["global_head_dim"])
    writer.add_key_length_swa(s["head_dim"])
    writer.add_value_length_swa(s["head_dim"])
    writer.add_sliding_window(s["window"])
    writer.add_sliding_window_pattern(sliding)
    writer.add_shared_kv_layers(0)
    writer.add_vocab_size(s["vocab"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    embd = s["embd"]
    _shape_tensor(writer, "token_embd.weight", s["vocab"], embd, _Q6_K)  # tied: no output.weight
    writer.add_tensor_info("output_norm.weight", (embd,), np.dtype(np.float32), embd * 4)
    for layer, swa in enumerate(sliding):
        heads_kv, head = (s["kv_heads"], s["head_dim"]) if swa else (s["global_kv_heads"], s["global_head_dim"])
        _q4_k_m_block(writer, layer, s["layers"], embd, s["heads"] * head, heads_kv * head, s["ff"], v=swa)  # K = V
    return _finish_shapes(writer, out)


def make_llama_shapes(
    out: Path,
    shape: dict[str, int] = LLAMA_70B,
    name: str = "llama-3-70b-q4_k_m-shapes",
    tokenizer_gguf: Path | None = None,
    long_rope: int = 0,
    metadata: dict[str, float | int] | None = None,
) -> Path:
    """A llama of ``shape`` in Q4_K_M, shapes only (Llama 3 70B by default: about 39.6 GiB apparent, as the real
    file; nothing on disk). With ``tokenizer_gguf`` (its vocabulary must be ``shape["vocab"]``: llama.cpp's
    models/ggml-vocab-llama-bpe.gguf for Llama 3) llama-server loads and runs it on its zero weights,
    answering noise with the real model's buffers (benchmarks/gpu_llamacpp_memory.py). With ``long_rope`` (an
    original training context), LongRoPE as conversion/phi.py writes it: ``rope.scaling.original_context_length``
    and the ``rope_factors_long`` / ``rope_factors_short`` tensors (head_dim / 2 floats each). ``metadata``: more
    keys (an int is written as int32, a float as float32), such as ``general.sampling.temp``."""
    if tokenizer_gguf is None:
        writer, vocab = gguf.GGUFWriter(str(out), "llama"), shape["vocab"]
        writer.add_name(name)
    else:
        writer, vocab = _writer(out, "llama", name, tokenizer_gguf)
        if vocab != shape["vocab"]:
            raise ValueError(f"{tokenizer_gguf} has {vocab} tokens; the shape needs {shape['vocab']}")
    _attention_shape(writer, shape, 131072)
    writer.add_feed_forward_length(shape["ff"])
    writer.add_rope_dimension_count(shape["head_dim"])
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for key, value in (metadata or {}).items():
        (writer.add_int32 if isinstance(value, int) else writer.add_float32)(key, value)
    embd, q, kv = shape["embd"], shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    _shape_tensor(writer, "token_embd.weight", vocab, embd, _Q4_K)
    writer.add_tensor_info("output_norm.weight", (embd,), np.dtype(np.float32), embd * 4)
    _shape_tensor(writer, "output.weight", vocab, embd, _Q6_K)
    if long_rope:
        writer.add_rope_scaling_orig_ctx_len(long_rope)
        for which in ("long", "short"):
            half = shape["head_dim"] // 2
            writer.add_tensor_info(f"rope_factors_{which}.weight", (half,), np.dtype(np.float32), half * 4)
    for layer in range(shape["layers"]):
        _q4_k_m_block(writer, layer, shape["layers"], embd, q, kv, shape["ff"])
    return _finish_shapes(writer, out)


def make_llama_70b_shapes(out: Path) -> Path:
    """Llama 3 70B in Q4_K_M, shapes only."""
    return make_llama_shapes(out)


MAKERS = {"tiny-moe": make_tiny_moe, "wide-llama": make_wide_llama}
SHAPE_MAKERS = {"gemma4-31b-shapes": make_gemma4_31b_shapes, "llama-70b-shapes": make_llama_70b_shapes}

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in SHAPE_MAKERS:
        print(SHAPE_MAKERS[sys.argv[1]](Path(sys.argv[2])))
    elif len(sys.argv) != 4 or sys.argv[1] not in MAKERS:
        sys.exit(__doc__)
    else:
        print(MAKERS[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3])))
