"""Model facts from a GGUF file (header and tensor table), or estimated from config.json when the GGUF
is not local: per-block, per-expert, embedding and output bytes, the way llama.cpp lays them out."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gateway.errors import ModelError
from gateway.modelfacts import ModelFacts, estimate_weight_bytes, text_config
from gateway.modelinfo import GgufHeader

_BLOCK = re.compile(r"^blk\.(\d+)\.")
_EXPERTS = re.compile(r"ffn_(up|down|gate|gate_up)_(ch)?exps")


def facts_from_gguf(header: GgufHeader, name: str) -> ModelFacts:
    """Facts from a GGUF header; per-layer bytes come from the tensor table."""
    arch = header.architecture

    def value(key: str, default: Any = 0) -> Any:
        found = header.metadata.get(f"{arch}.{key}", default)
        return default if not isinstance(found, int | float | str) else found

    layers = int(value("block_count"))
    if not layers:
        raise ModelError(f"{name}: GGUF has no {arch}.block_count")
    layer_bytes = [0] * layers
    expert_bytes = [0] * layers
    embedding = output = 0
    for tensor in header.tensors:
        match = _BLOCK.match(tensor.name)
        if match and int(match.group(1)) < layers:
            layer_bytes[int(match.group(1))] += tensor.nbytes
            if _EXPERTS.search(tensor.name):
                expert_bytes[int(match.group(1))] += tensor.nbytes
        elif tensor.name.startswith("token_embd"):
            embedding += tensor.nbytes
        elif tensor.name.startswith("output"):
            output += tensor.nbytes
    if not any(t.name == "output.weight" for t in header.tensors):
        output += embedding  # tied embeddings: llama.cpp duplicates the matrix for the output layer
    heads = int(value("attention.head_count", 1)) or 1
    hidden = int(value("embedding_length"))
    kv_heads = int(value("attention.head_count_kv", heads)) or heads
    key_length = int(value("attention.key_length", hidden // heads))
    window = int(value("attention.sliding_window")) or None
    sliding_layers = 0
    if window:
        pattern = {"gemma3": 6, "gemma3n": 5, "gpt-oss": 2, "cohere2": 4}.get(arch, 1)
        sliding_layers = layers - layers // pattern if pattern > 1 else layers
    total = sum(t.nbytes for t in header.tensors)
    return ModelFacts(
        name=name,
        model_type=arch,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=key_length,
        intermediate_size=int(value("feed_forward_length")),
        vocab_size=int(value("vocab_size")) or int(getattr(header.metadata.get("tokenizer.ggml.tokens"), "count", 0)),
        max_position=int(value("context_length")) or None,
        dtype="float16",
        quantization=f"gguf file type {header.metadata.get('general.file_type', '?')}",
        weight_bytes=total,
        weight_bytes_source="gguf tensor table",
        kv_lora_rank=int(value("attention.kv_lora_rank")),
        qk_rope_head_dim=int(value("rope.dimension_count")) if value("attention.kv_lora_rank") else 0,
        sliding_window=window,
        sliding_layers=sliding_layers,
        num_experts=int(value("expert_count")),
        experts_per_token=int(value("expert_used_count")),
        moe_intermediate_size=int(value("expert_feed_forward_length")),
        layer_bytes=tuple(layer_bytes),
        expert_layer_bytes=tuple(expert_bytes),
        embedding_bytes=embedding,
        output_bytes=output,
        gguf_key_length=int(value("attention.key_length_mla", key_length))
        if value("attention.kv_lora_rank")
        else key_length,
        gguf_value_length=int(value("attention.value_length", key_length)),
    )


# bits per weight of common GGUF quantization mixes (llama.cpp's quantize table, whole-model averages)
GGUF_BITS_PER_WEIGHT = {
    "IQ2_XXS": 2.06, "Q2_K": 3.35, "IQ3_XXS": 3.06, "Q3_K_M": 3.91, "IQ4_XS": 4.25, "IQ4_NL": 4.5,
    "Q4_0": 4.55, "Q4_K_S": 4.58, "Q4_K_M": 4.85, "Q5_K_S": 5.54, "Q5_K_M": 5.69, "Q6_K": 6.56,
    "Q8_0": 8.5, "F16": 16.0, "BF16": 16.0,
}  # fmt: skip


def gguf_bits_from_name(file_name: str) -> float | None:
    """'GLM-4.7-Flash-Q4_K_M.gguf' → 4.85; None when the name carries no known type."""
    upper = file_name.upper()
    for name in sorted(GGUF_BITS_PER_WEIGHT, key=len, reverse=True):
        if name in upper:
            return GGUF_BITS_PER_WEIGHT[name]
    return None


def estimate_gguf_facts(facts: ModelFacts, config: dict[str, Any], bits: float) -> ModelFacts:
    """Per-layer GGUF sizes from the architecture when the GGUF itself cannot be read (not downloaded)."""
    cfg = text_config(config)
    per_weight = bits / 8
    total_linear = estimate_weight_bytes(cfg, None) / 2  # parameter count (at 2 bytes each)
    embeddings = facts.vocab_size * facts.hidden_size
    untied = not cfg.get("tie_word_embeddings")
    block_params = max(0.0, total_linear - embeddings * (2 if untied else 1)) / facts.num_layers
    experts_per_block = 0.0
    if facts.is_moe:
        experts_per_block = (
            facts.num_experts * 3 * facts.hidden_size * (facts.moe_intermediate_size or facts.intermediate_size)
        )
        dense = int(cfg.get("first_k_dense_replace") or 0)
        experts_per_block *= (facts.num_layers - dense) / facts.num_layers
    layer = int(block_params * per_weight)
    return replace(
        facts,
        layer_bytes=(layer,) * facts.num_layers,
        expert_layer_bytes=(int(experts_per_block * per_weight),) * facts.num_layers,
        embedding_bytes=int(embeddings * per_weight),
        output_bytes=int(embeddings * 6.56 / 8),  # llama.cpp quantizes the output matrix to Q6_K
        weight_bytes=int(layer * facts.num_layers + embeddings * per_weight + embeddings * 6.56 / 8),
        weight_bytes_source=f"estimated at {bits} bits/weight",
        gguf_key_length=(facts.kv_lora_rank + facts.qk_rope_head_dim) if facts.is_mla else facts.head_dim,
        gguf_value_length=facts.head_dim,
        quantization=f"gguf ~{bits} bpw",
        notes=(*facts.notes, f"GGUF not available locally: layer sizes estimated at {bits} bits/weight"),
    )
