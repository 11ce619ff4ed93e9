"""Model facts from a GGUF file (header and tensor table), or estimated from config.json when the GGUF
is not local: per-block, per-expert, embedding and output bytes, the way llama.cpp lays them out."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from gateway.backends.checked import integer
from gateway.backends.llamacpp.gguf_reader import GgufHeader
from gateway.backends.model_facts import ModelFacts, estimate_weight_bytes, recurrent_layout, text_config
from gateway.backends.sampling import Sampling, checked
from gateway.core.errors import ModelError

# llama.cpp's sliding-window pattern per architecture, for GGUFs that carry a window but no per-layer
# pattern: layer il slides unless il % n == n - 1 (the one table; placement reads it too)
SWA_PATTERN = {"gemma3": 6, "gemma3_text": 6, "gemma3n": 5, "gpt-oss": 2, "gpt_oss": 2, "cohere2": 4, "gemma2": 2}

_BIG = (1 << 31) - 1  # llama.cpp holds these in 32-bit integers
# the header's sizes and counts (``<arch>.<key>``), each checked before use: (lowest, highest) a real model has
GGUF_LIMITS = {
    "block_count": (1, 4096), "embedding_length": (1, 1 << 20), "attention.head_count": (0, 1 << 14),
    "attention.head_count_kv": (0, 1 << 14), "attention.key_length": (0, 1 << 16),
    "attention.value_length": (0, 1 << 16), "attention.key_length_mla": (0, 1 << 16),
    "attention.key_length_swa": (0, 1 << 16), "attention.value_length_swa": (0, 1 << 16),
    "attention.kv_lora_rank": (0, 1 << 16), "rope.dimension_count": (0, 1 << 16), "context_length": (0, _BIG),
    "feed_forward_length": (0, 1 << 24), "vocab_size": (0, 1 << 24), "attention.sliding_window": (0, _BIG),
    "attention.shared_kv_layers": (0, 4096), "expert_count": (0, 1 << 16), "expert_used_count": (0, 1 << 16),
    "expert_feed_forward_length": (0, 1 << 24), "nextn_predict_layers": (0, 64), "full_attention_interval": (0, 4096),
    "ssm.inner_size": (0, 1 << 24), "ssm.time_step_rank": (0, 1 << 14), "ssm.state_size": (0, 1 << 16),
    "ssm.group_count": (0, 1 << 14), "ssm.conv_kernel": (0, 1 << 10),
    "rope.scaling.original_context_length": (0, _BIG),
}  # fmt: skip
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_EXPERTS = re.compile(r"ffn_(up|down|gate|gate_up)_(ch)?exps")


@dataclass(frozen=True)
class GgufFacts(ModelFacts):
    """The model's facts with what llama.cpp alone reads of a GGUF: its per-block layout and its
    per-layer attention (read from the header and tensor table, or estimated from config.json)."""

    # per-block bytes, expert bytes per block, token embedding and output bytes
    layer_bytes: tuple[int, ...] = ()
    expert_layer_bytes: tuple[int, ...] = ()
    embedding_bytes: int = 0
    output_bytes: int = 0
    # K and V per KV head as the cache stores them where they differ from head_dim (MLA: the latent)
    cache_key_dim: int = 0
    cache_value_dim: int = 0
    # per-layer attention where layers differ (Gemma 4: sliding 16 KV heads × 256, full 4 × 512);
    # empty: every layer has num_kv_heads and the sliding layers follow sliding_layers
    kv_heads_per_layer: tuple[int, ...] = ()
    sliding_per_layer: tuple[bool, ...] = ()
    cache_key_dim_sliding: int = 0  # K and V head sizes of the sliding layers (0: as the full ones)
    cache_value_dim_sliding: int = 0
    shared_kv_layers: int = 0  # the last N layers reuse earlier layers' cache (Gemma 3n / 4 E2B, E4B)
    recurrent_pattern: tuple[bool, ...] = ()  # per layer of a hybrid model: True where it is recurrent
    # LongRoPE (Phi-3/3.5/4-mini, MiniCPM3): llama.cpp takes the long RoPE factors for every token once its
    # context (-c with --kv-unified) passes this, the original training context; 0: no such switch
    long_rope_context: int = 0
    # the tensor table's weights (elements) and the GGML type holding most of its bytes: the file's real
    # precision, whatever its name says (0 and "": sizes estimated, no table read)
    weight_count: int = 0
    main_weight_type: str = ""

    @property
    def bits_per_weight(self) -> float:
        """The file's bytes over its weights (norms and embeddings included): 0 when no table was read."""
        return round(8 * self.weight_bytes / self.weight_count, 2) if self.weight_count else 0.0

    def is_recurrent(self, layer: int) -> bool:
        return layer < len(self.recurrent_pattern) and self.recurrent_pattern[layer]

    def __hash__(self) -> int:
        """The fields' hash, worked out once: the planner's caches are keyed by the facts (41 fields,
        per-block tuples), and hashing them afresh on each of a plan's ~100,000 lookups cost more than
        most of what those caches hold."""
        known: int | None = self.__dict__.get("_hash")
        if known is None:
            known = hash(tuple(getattr(self, field.name) for field in fields(self) if field.compare))
            object.__setattr__(self, "_hash", known)
        return known

    @classmethod
    def from_config(cls, facts: ModelFacts, config: dict[str, Any]) -> GgufFacts:
        """config.json's facts, before the GGUF layout is filled in: which layers are recurrent, as the
        config says."""
        pattern = recurrent_layout(text_config(config), facts.num_layers)[0] if facts.recurrent_layers else ()
        return cls(**{f.name: getattr(facts, f.name) for f in fields(ModelFacts)}, recurrent_pattern=pattern)


def _per_layer(found: Any, layers: int) -> tuple[Any, ...]:
    """A per-layer array (``_ArrayOf`` with its values), or () when the key is a scalar or absent."""
    values = tuple(getattr(found, "values", ()) or ())
    return values if len(values) == layers else ()


def facts_from_gguf(header: GgufHeader, name: str, where: str = "") -> GgufFacts:
    """Facts from a GGUF header; per-layer bytes come from the tensor table, attention from
    :func:`_attention`."""
    arch = header.architecture
    value = _Keys(header, where or name)
    if header.metadata.get(f"{arch}.block_count") is None:
        raise ModelError(f"{where or name}: GGUF has no {arch}.block_count")
    layers = int(value("block_count"))
    layer_bytes, expert_bytes, embedding, output = _tensor_bytes(header, layers)
    hidden = int(value("embedding_length"))
    attention = _attention(header, value, layers, hidden)
    mtp = min(int(value("nextn_predict_layers")), layers)
    recurrent, kind, dims = _recurrent(value, layers - mtp, attention.kv_array)
    return GgufFacts(
        name=name,
        model_type=arch,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=attention.heads,
        num_kv_heads=attention.kv_heads,
        head_dim=attention.key_length,
        intermediate_size=int(value("feed_forward_length")),
        vocab_size=int(value("vocab_size")) or int(getattr(header.metadata.get("tokenizer.ggml.tokens"), "count", 0)),
        max_position=int(value("context_length")) or None,
        quantization=f"gguf file type {header.metadata.get('general.file_type', '?')}",
        weight_bytes=sum(t.nbytes for t in header.tensors),
        weight_bytes_source="gguf tensor table",
        kv_lora_rank=int(value("attention.kv_lora_rank")),
        qk_rope_head_dim=int(value("rope.dimension_count")) if value("attention.kv_lora_rank") else 0,
        sliding_window=attention.window,
        sliding_layers=_sliding_layers(arch, layers, attention.window, attention.pattern),
        num_experts=int(value("expert_count")),
        experts_per_token=int(value("expert_used_count")),
        moe_intermediate_size=int(value("expert_feed_forward_length")),
        layer_bytes=tuple(layer_bytes),
        expert_layer_bytes=tuple(expert_bytes),
        embedding_bytes=embedding,
        output_bytes=output,
        cache_key_dim=attention.cache_key_dim,
        cache_value_dim=int(value("attention.value_length", attention.key_length)),
        kv_heads_per_layer=attention.kv_array if len(set(attention.kv_array)) > 1 else (),
        sliding_per_layer=attention.pattern if attention.window else (),
        cache_key_dim_sliding=int(value("attention.key_length_swa")),
        cache_value_dim_sliding=int(value("attention.value_length_swa")),
        shared_kv_layers=int(value("attention.shared_kv_layers")),
        # GLM-4.x, DeepSeek-V3, Qwen3-Next: the MTP (nextn) blocks are the GGUF's last ones
        mtp_layers=mtp,
        recurrent_layers=sum(recurrent),
        recurrent_kind=kind,
        recurrent_dims=dims,
        recurrent_pattern=recurrent,
        long_rope_context=_long_rope_context(header, value),
        weight_count=sum(math.prod(t.shape) for t in header.tensors),
        main_weight_type=_main_type(header),
        sampling=gguf_sampling(header, where or name),
    )


@dataclass(frozen=True)
class _Attention:
    """A GGUF's attention heads and sizes, the largest where they vary per layer."""

    heads: int
    kv_heads: int
    kv_array: tuple[int, ...]  # the KV heads of each layer, where the GGUF gives them per layer; else ()
    key_length: int
    window: int | None  # the sliding window; None: no layer slides
    pattern: tuple[bool, ...]  # per layer: True where it slides, where the GGUF says; else ()
    cache_key_dim: int  # what a cached key holds per head (MLA: its compressed size)


def _attention(header: GgufHeader, value: _Keys, layers: int, hidden: int) -> _Attention:
    """Per-layer attention as llama.cpp's loader reads it: ``head_count_kv`` may be an array (one count per
    layer; ``get_key_or_arr``), and ``attention.sliding_window_pattern`` an array of booleans (true:
    the layer slides), as convert_hf_to_gguf.py writes them for Gemma 4 from ``layer_types`` and
    ``num_global_key_value_heads``; the sliding layers' head sizes are ``key_length_swa`` /
    ``value_length_swa`` (Gemma 4 31B: 50 sliding layers of 16 KV heads × 256, 10 full of 4 × 512)."""
    head_array = value.per_layer("attention.head_count", layers)
    heads = (max(head_array) if head_array else int(value("attention.head_count", 1))) or 1
    kv_array = value.per_layer("attention.head_count_kv", layers)
    kv_heads = (max(kv_array) if kv_array else int(value("attention.head_count_kv", heads))) or heads
    key_length = int(value("attention.key_length", hidden // heads))
    window = int(value("attention.sliding_window")) or None
    swa_pattern = header.metadata.get(f"{header.architecture}.attention.sliding_window_pattern")
    pattern = tuple(bool(v) for v in _per_layer(swa_pattern, layers))
    mla = value("attention.kv_lora_rank")
    cache_key_dim = int(value("attention.key_length_mla", key_length)) if mla else key_length
    return _Attention(heads, kv_heads, kv_array, key_length, window, pattern, cache_key_dim)


def _long_rope_context(header: GgufHeader, value: _Keys) -> int:
    """Where llama.cpp switches to the long RoPE factors (LongRoPE), else 0. llama_model::get_rope_factors
    (src/llama-model.cpp:2343): rope_freqs first, else long past n_ctx_orig_yarn
    (rope.scaling.original_context_length, else context_length: llama-model.cpp:1412)."""
    names = {t.name for t in header.tensors}
    original = int(value("rope.scaling.original_context_length")) or int(value("context_length"))  # checked always
    return original if "rope_factors_long.weight" in names and "rope_freqs.weight" not in names else 0


# general.sampling.* (llama.cpp's LLM_KV_GENERAL_SAMPLING_*, applied by common_init_from_params over its
# defaults where no flag was given) → the recommended sampling's fields
GGUF_SAMPLING_KEYS = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
}


def gguf_sampling(header: GgufHeader, where: str) -> Sampling | None:
    """The sampling a GGUF's ``general.sampling.*`` keys recommend (most GGUFs carry none)."""
    values = {field: header.metadata.get(f"general.sampling.{key}") for key, field in GGUF_SAMPLING_KEYS.items()}
    return checked(values, f"general.sampling.* of {where}")


# ggml.h's ggml_type ids of the types a published GGUF's weights are stored in (the rest are named by id)
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
    12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
    21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip


def _main_type(header: GgufHeader) -> str:
    """The GGML type holding the most bytes of the tensor table (gpt-oss's MXFP4 file: MXFP4, its experts)."""
    by_type: dict[int, int] = {}
    for tensor in header.tensors:
        by_type[tensor.type_id] = by_type.get(tensor.type_id, 0) + tensor.nbytes
    if not by_type:
        return ""
    main = max(by_type, key=lambda type_id: by_type[type_id])
    return GGML_TYPE_NAMES.get(main, f"type {main}")


def long_rope_context(config: dict[str, Any]) -> int:
    """What convert_hf_to_gguf.py (conversion/phi.py) makes of a LongRoPE config.json: the original
    context where ``rope_scaling`` has ``long_factor`` (0 otherwise)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, dict) or not rope.get("long_factor"):
        return 0
    for original in (rope.get("original_max_position_embeddings"), config.get("original_max_position_embeddings"),
                     config.get("max_position_embeddings")):  # fmt: skip
        if isinstance(original, int) and original > 0:
            return original
    return 0


class _Keys:
    """The header's ``<arch>.<key>`` values; a count or size is checked to be a whole number a real
    model could have (``GGUF_LIMITS``), else ModelError naming it."""

    def __init__(self, header: GgufHeader, where: str) -> None:
        self.metadata, self.arch, self.where = header.metadata, header.architecture, where

    def __call__(self, key: str, default: Any = 0) -> Any:
        found = self.metadata.get(f"{self.arch}.{key}")
        if found is None or not isinstance(found, int | float | str):
            return default
        if key in GGUF_LIMITS:
            return integer(found, self.where, f"{self.arch}.{key}", *GGUF_LIMITS[key])
        return found

    def per_layer(self, key: str, layers: int) -> tuple[int, ...]:
        values = _per_layer(self.metadata.get(f"{self.arch}.{key}"), layers)
        return tuple(integer(v, self.where, f"{self.arch}.{key}[]", *GGUF_LIMITS[key]) for v in values)


def _tensor_bytes(header: GgufHeader, layers: int) -> tuple[list[int], list[int], int, int]:
    """From the tensor table: each block's bytes, each block's expert bytes, the token embedding's and
    the output's (tied embeddings: llama.cpp duplicates the matrix for the output layer)."""
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
        output += embedding
    return layer_bytes, expert_bytes, embedding, output


def _sliding_layers(arch: str, layers: int, window: int | None, pattern: tuple[bool, ...]) -> int:
    """How many layers slide: as the per-layer pattern says, else llama.cpp's pattern for the architecture."""
    if window and pattern:
        return sum(pattern)
    if window:
        every = SWA_PATTERN.get(arch, 1)
        return layers - layers // every if every > 1 else layers
    return 0


def _recurrent(value: Any, trunk: int, kv_heads: tuple[int, ...]) -> tuple[tuple[bool, ...], str, tuple[int, ...]]:
    """A hybrid GGUF's recurrent layers as llama.cpp's loader finds them (src/models/qwen3next.cpp:
    all but every ``full_attention_interval``-th trunk layer; granite-hybrid.cpp: layers with no KV
    head) and their ``ssm.*`` sizes, in the terms of :class:`ModelFacts`."""
    inner, heads = int(value("ssm.inner_size")), int(value("ssm.time_step_rank"))
    if not inner or not heads:
        return (), "", ()
    state, groups, kernel = (
        int(value("ssm.state_size")),
        int(value("ssm.group_count")) or 1,
        int(value("ssm.conv_kernel")),
    )
    if interval := int(value("full_attention_interval")):  # gated delta-net (Qwen3-Next)
        pattern = tuple((i + 1) % interval != 0 for i in range(trunk))
        return pattern, "gated_delta_net", (groups, heads, state, inner // heads, kernel)
    if kv_heads:  # Mamba-2 among attention layers (Granite 4.0-H)
        return tuple(n == 0 for n in kv_heads[:trunk]), "mamba2", (inner, groups, heads, inner // heads, state, kernel)
    return (), "", ()


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


def estimate_gguf_facts(facts: ModelFacts, config: dict[str, Any], bits: float) -> GgufFacts:
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
    global_head = int(cfg.get("global_head_dim") or facts.head_dim)
    # convert_hf_to_gguf.py writes the MTP (nextn) blocks as the last blocks: block_count counts them
    blocks = facts.num_layers + facts.mtp_layers
    experts = int(experts_per_block * per_weight)
    attention = _per_layer_attention(GgufFacts.from_config(facts, config), cfg)
    return replace(
        attention,
        num_layers=blocks,
        sliding_per_layer=_extended(attention.sliding_per_layer, facts.mtp_layers, False),
        kv_heads_per_layer=_extended(attention.kv_heads_per_layer, facts.mtp_layers, facts.num_kv_heads),
        layer_bytes=(layer,) * blocks,
        expert_layer_bytes=(experts,) * blocks,
        embedding_bytes=int(embeddings * per_weight),
        output_bytes=int(embeddings * 6.56 / 8),  # llama.cpp quantizes the output matrix to Q6_K
        weight_bytes=int(layer * blocks + embeddings * per_weight + embeddings * 6.56 / 8),
        weight_bytes_source=f"estimated at {bits} bits/weight",
        cache_key_dim=(facts.kv_lora_rank + facts.qk_rope_head_dim) if facts.is_mla else global_head,
        cache_value_dim=global_head,
        quantization=f"gguf ~{bits} bpw",
        long_rope_context=long_rope_context(cfg),
        # the config's own weight estimate (if any) is replaced by this one: the GGUF's size is what counts
        notes=(f"GGUF size estimated at {bits} bits/weight from the architecture (the file is not local yet)",),
    )


def _extended(per_layer: tuple[Any, ...], extra: int, value: Any) -> tuple[Any, ...]:
    """A per-layer array with ``extra`` more entries of ``value`` (the nextn blocks), when it has any."""
    return (*per_layer, *(value,) * extra) if per_layer and extra else per_layer


def _per_layer_attention(facts: GgufFacts, cfg: dict[str, Any]) -> GgufFacts:
    """What convert_hf_to_gguf.py would write per layer (its Gemma 4 converter): the sliding pattern
    from ``layer_types``; with ``num_global_key_value_heads``, KV heads per layer (full layers take the
    global count) and the sliding layers' head size ``head_dim`` beside the full ones'
    ``global_head_dim``; ``num_kv_shared_layers`` layers without a cache of their own."""
    layer_types = cfg.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != facts.num_layers or not facts.sliding_window:
        return facts
    pattern = tuple(str(kind) == "sliding_attention" for kind in layer_types)
    global_heads = cfg.get("num_global_key_value_heads")
    per_layer: tuple[int, ...] = ()
    if global_heads:
        per_layer = tuple(facts.num_kv_heads if swa else int(global_heads) for swa in pattern)
    swa_head = facts.head_dim if cfg.get("global_head_dim") else 0
    return replace(
        facts,
        sliding_per_layer=pattern,
        kv_heads_per_layer=per_layer,
        cache_key_dim_sliding=swa_head,
        cache_value_dim_sliding=swa_head,
        shared_kv_layers=int(cfg.get("num_kv_shared_layers") or 0),
    )
