"""Synthetic GGUFs that llama-server loads, for placement runs (generated at run time, never committed).

    python benchmarks/synthetic_gguf.py tiny-moe OUT.gguf TOKENIZER.gguf
    python benchmarks/synthetic_gguf.py wide-llama OUT.gguf TOKENIZER.gguf

- ``tiny-moe``: qwen3moe with random F16 weights: 12 blocks of 16 experts (4 used per token, FFN width
  256), grouped-query attention (8 heads, 2 KV heads of 64), an untied output matrix; about 250 MiB.
  Like real Qwen3 MoE GGUFs, ``feed_forward_length`` is the dense width (experts used × 256) and
  ``expert_feed_forward_length`` the experts' own.
- ``wide-llama``: llama with Llama 3 8B's widths (hidden 4096, FFN 14336, 32 heads, 8 KV heads of 128)
  but 4 blocks, Q8_0 zeros; about 1.3 GiB. Compute buffers scale with the widths, not the depth.

Both copy the tokenizer and chat template from another GGUF (SmolLM2's, 49,152 tokens). The answers
are noise; the buffers llama.cpp allocates are real, which is all the placement benchmark needs.
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


MAKERS = {"tiny-moe": make_tiny_moe, "wide-llama": make_wide_llama}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in MAKERS:
        sys.exit(__doc__)
    print(MAKERS[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3])))
