"""What every engine plans from about a model, read from its config.json.

The engines read their own files beside themselves and extend these facts there: llama.cpp a GGUF's
header and tensor table (``gateway/backends/llamacpp/gguf_facts``), vLLM a checkpoint's directory or the
hub's safetensors index (``gateway/backends/vllm/checkpoint_facts``). When no source gives the weight bytes
they are estimated from the architecture, and the facts say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.backends.checked import integer
from gateway.backends.sampling import Sampling
from gateway.core.errors import ModelError

# bytes per weight for linear layers by checkpoint quantization (scales and zero points included)
_LINEAR_BYTES = {
    None: 2.0,
    "fp8": 1.0 + 4 / (128 * 128),  # block-wise scales
    "awq": 0.5 + 2.5 / 128,  # int4 + fp16 scale + int4 zero per group of 128
    "gptq": 0.5 + 2.5 / 128,
    "mxfp4": 0.5 + 1 / 32,  # e8m0 scale per 32
    "nvfp4": 0.5 + 1 / 16 + 0.0,  # fp8 scale per 16
    "int8": 1.0 + 2 / 128,
    "int4": 0.5 + 2.5 / 128,
    "mxfp8": 1.0 + 1 / 32,  # e8m0 scale per 32  # compressed-tensors W4A16 (GPTQ-like groups of 128)
}


@dataclass(frozen=True)
class ModelFacts:
    """A model's architecture and weights as every engine plans from them. What one engine alone
    reads of its own file format extends this beside that engine: llama.cpp's per-block GGUF layout
    (``gateway/backends/llamacpp/gguf_facts.GgufFacts``), what vLLM reads of a Hugging Face checkpoint
    (``gateway/backends/vllm/checkpoint_facts.CheckpointFacts``)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position: int | None
    quantization: str | None
    weight_bytes: int
    weight_bytes_source: str
    kv_lora_rank: int = 0  # MLA latent size (0: not an MLA model)
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers use the sliding window
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # multi-token-prediction layers (num_nextn_predict_layers), loaded only for speculative decoding
    mtp_layers: int = 0
    # hybrid models: layers with no per-token KV cache (linear attention, Mamba) that keep a fixed
    # recurrent state per sequence instead; its kind and the dimensions the engines size it from
    # ("gated_delta_net": k heads, v heads, k head dim, v head dim, conv kernel; "mamba2":
    # intermediate, groups, heads, head dim, state size, conv kernel)
    recurrent_layers: int = 0
    recurrent_kind: str = ""
    recurrent_dims: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # the sampling its authors recommend, from the most trusted source that gives one (gateway/backends/sampling.py);
    # None: none says, and the engine's own defaults stand
    sampling: Sampling | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


_BIG = (1 << 31) - 1  # llama.cpp and vLLM hold these in 32-bit integers
# config.json's sizes and counts, each checked before use: (lowest, highest) a real model has
CONFIG_LIMITS = {
    "hidden_size": (1, 1 << 20), "num_hidden_layers": (1, 4096), "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (0, 1 << 14), "head_dim": (0, 1 << 16), "intermediate_size": (0, 1 << 24),
    "vocab_size": (0, 1 << 24), "max_position_embeddings": (0, _BIG), "sliding_window": (0, _BIG),
    "sliding_window_pattern": (0, 4096), "kv_lora_rank": (0, 1 << 16), "q_lora_rank": (0, 1 << 16),
    "qk_rope_head_dim": (0, 1 << 16), "qk_nope_head_dim": (0, 1 << 16), "v_head_dim": (0, 1 << 16),
    "n_routed_experts": (0, 1 << 16), "num_experts": (0, 1 << 16), "num_local_experts": (0, 1 << 16),
    "num_experts_per_tok": (0, 1 << 16), "experts_per_token": (0, 1 << 16), "moe_intermediate_size": (0, 1 << 24),
    "first_k_dense_replace": (0, 4096), "n_shared_experts": (0, 1 << 16),
    "shared_expert_intermediate_size": (0, 1 << 24), "global_head_dim": (0, 1 << 16),
    "num_global_key_value_heads": (0, 1 << 14), "num_nextn_predict_layers": (0, 64), "mtp_num_hidden_layers": (0, 64),
    "num_kv_shared_layers": (0, 4096), "full_attention_interval": (0, 4096), "linear_num_key_heads": (0, 1 << 14),
    "linear_num_value_heads": (0, 1 << 14), "linear_key_head_dim": (0, 1 << 16), "linear_value_head_dim": (0, 1 << 16),
    "linear_conv_kernel_dim": (0, 1 << 10), "mamba_n_heads": (0, 1 << 14), "mamba_d_head": (0, 1 << 16),
    "mamba_d_state": (0, 1 << 16), "mamba_d_conv": (0, 1 << 10), "mamba_expand": (0, 64),
    "mamba_n_groups": (0, 1 << 14), "depth": (0, 4096),
}  # fmt: skip


def check_config(config: dict[str, Any], name: str) -> None:
    """Every size and count config.json gives (the model's, its text model's, its vision tower's) within
    what a real model has; ModelError naming the field and value otherwise."""
    sections = [("", config)]
    for key in ("text_config", "llm_config", "vision_config"):
        if isinstance(config.get(key), dict):
            sections.append((f"{key}.", config[key]))
        elif config.get(key) is not None:
            raise ModelError(f"config.json of {name}: {key} is a {type(config[key]).__name__}, not an object")
    for prefix, section in sections:
        for key, (low, high) in CONFIG_LIMITS.items():
            value = section.get(key)
            if value is not None and value is not False:  # null and false mean "none" in real configs
                integer(value, f"config.json of {name}", prefix + key, low, high)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model; its fields win, the outer ones fill gaps."""
    inner = config.get("text_config") or config.get("llm_config") or {}
    return {**config, **inner} if isinstance(inner, dict) else config


def _quantization(config: dict[str, Any], override: str | None) -> str | None:
    """The storage format: ModelOpt's ``quant_algo`` and compressed-tensors' weight scheme read
    exactly (a ModelOpt FP8 checkpoint is ~1 byte per weight, not NVFP4's ~0.56)."""
    if override:
        return override.lower()
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    algo = quant_algo(qc)
    if method == "modelopt_fp4":
        return "nvfp4"
    if method.startswith("modelopt"):
        return "nvfp4" if "FP4" in algo else "mxfp8" if "MXFP8" in algo else "fp8" if "FP8" in algo else None
    if method == "compressed-tensors":
        return _compressed_tensors_format(qc)
    return method or None


def quant_algo(section: dict[str, Any]) -> str:
    """``quant_algo`` of a ModelOpt section: top level or under "quantization", upper-cased as
    vLLM's ``_extract_modelopt_quant_algo`` does."""
    inner = section.get("quantization")
    source = inner if isinstance(inner, dict) else section
    return str(source.get("quant_algo") or "").upper()


def _compressed_tensors_format(qc: dict[str, Any]) -> str:
    """The weight format of compressed-tensors' first config group: 4-bit float in groups of 16
    is NVFP4, of 32 MXFP4; 8-bit float FP8; integers int8 or int4 (W4A16)."""
    groups = qc.get("config_groups")
    weights: dict[str, Any] = {}
    if isinstance(groups, dict):
        for group in groups.values():
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                weights = group["weights"]
                break
    bits = int(weights.get("num_bits") or 8)
    kind = str(weights.get("type") or "int").lower()
    if kind == "float":
        if bits == 4:
            return "mxfp4" if int(weights.get("group_size") or 16) == 32 else "nvfp4"
        return "fp8"
    return "int4" if bits == 4 else "int8"


def _sliding(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        count = sum(1 for kind in layer_types if "sliding" in str(kind))
        return (int(window) if window else None), count
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:  # e.g. gemma3: every pattern-th layer is global
        return int(window), layers - layers // pattern
    return int(window), layers


def _attention_params(cfg: dict[str, Any], hidden: int, layers: int, heads: int) -> int:
    """Attention weights of all layers; Gemma 4's full layers have their own head size and KV heads
    and, with ``attention_k_eq_v``, no v_proj (K is loaded into both slots)."""
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if cfg.get("kv_lora_rank"):
        q_rank = cfg.get("q_lora_rank")
        qk_head = int(cfg.get("qk_nope_head_dim", 0)) + int(cfg.get("qk_rope_head_dim", 0))
        v_head = int(cfg.get("v_head_dim", head_dim))
        q = hidden * int(q_rank) + int(q_rank) * heads * qk_head if q_rank else hidden * heads * qk_head
        kv = hidden * (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0)))
        kv += int(cfg["kv_lora_rank"]) * heads * (int(cfg.get("qk_nope_head_dim", 0)) + v_head)
        return layers * (q + kv + heads * v_head * hidden)
    uniform = hidden * head_dim * (2 * heads + 2 * kv_heads)
    global_dim = int(cfg.get("global_head_dim") or 0)
    full_layers = layers - _sliding(cfg, layers)[1] if global_dim else 0
    if not full_layers:
        return layers * uniform
    global_kv = int(cfg.get("num_global_key_value_heads") or kv_heads)
    kv_projections = 1 if cfg.get("attention_k_eq_v") else 2
    full = hidden * global_dim * (2 * heads + kv_projections * global_kv)
    return (layers - full_layers) * uniform + full_layers * full


def estimate_weight_bytes(cfg: dict[str, Any], quantization: str | None, kept: tuple[str, ...] = ()) -> int:
    """Parameter count from the architecture × bytes per parameter; embeddings stay 16-bit, and so do
    the parts a quantized checkpoint keeps (``kept``: "attention", "mlp")."""
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    vocab = int(cfg.get("vocab_size") or 0)
    attention = _attention_params(cfg, hidden, layers, heads)
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    dense_mlp = 3 * hidden * int(cfg.get("intermediate_size") or 0)
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
        shared = int(cfg.get("n_shared_experts") or 0) * 3 * hidden * moe_inter
        shared += 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
        moe_mlp = experts * 3 * hidden * moe_inter + shared + hidden * experts
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        mlp = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    else:
        mlp = layers * dense_mlp
    quantized = _LINEAR_BYTES.get(quantization, 2.0)
    linear = attention * (2.0 if "attention" in kept else quantized) + mlp * (2.0 if "mlp" in kept else quantized)
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    norms = layers * 2 * hidden + hidden
    return int(linear + (embeddings + norms) * 2)


def estimate_vision_bytes(config: dict[str, Any]) -> int:
    """A vision tower's 16-bit weights from ``vision_config`` (ViT blocks: 4 h² attention + 2 h ×
    intermediate MLP), or 0 for a text-only model. An estimate: towers differ in their extras."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    hidden = int(vision.get("hidden_size") or 0)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or 0)
    inter = int(vision.get("intermediate_size") or 4 * hidden)
    return layers * (4 * hidden * hidden + 2 * hidden * inter) * 2


# Parts that published quantized checkpoints keep in 16 bits, for when only config.json is at hand
# (no hf_quant_config.json, no ignore list): ModelOpt NVFP4 Gemma 4 (nvidia/Gemma-4-31B-IT-NVFP4)
# excludes every self_attn, lm_head and the vision tower; ModelOpt keeps lm_head otherwise too.
KNOWN_KEPT = {("nvfp4", "gemma4"): ("attention", "lm_head", "vision"), ("nvfp4", ""): ("lm_head",)}


def kept_parts(patterns: list[str]) -> tuple[str, ...]:
    """Which parts an ignore/exclude list keeps unquantized. A router gate alone is not the MLP."""
    parts: set[str] = set()
    for pattern in (str(p).lower() for p in patterns):
        if "attn" in pattern or "attention" in pattern:
            parts.add("attention")
        if "lm_head" in pattern:
            parts.add("lm_head")
        if any(word in pattern for word in ("vision", "visual", "image", "audio", "multi_modal", "mm_")):
            parts.add("vision")
        if ("mlp" in pattern or "expert" in pattern) and not re.search(r"(gate\$?|router)$", pattern):
            parts.add("mlp")
    return tuple(sorted(parts))


def quant_exclusions(
    config: dict[str, Any], quant_file: dict[str, Any] | None, quant: str | None
) -> tuple[tuple[str, ...], str]:
    """(kept parts, where the list came from): hf_quant_config.json, config.json, else a known list."""
    if isinstance(quant_file, dict):
        section = quant_file.get("quantization") or quant_file
        patterns = section.get("exclude_modules") or section.get("ignore")
        if isinstance(patterns, list):
            return kept_parts(patterns), "hf_quant_config.json"
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        for key in ("ignore", "exclude_modules", "modules_to_not_convert", "ignored_layers"):
            if isinstance(qc.get(key), list):
                return kept_parts(qc[key]), "config.json quantization_config"
    if not quant:
        return (), ""
    family = "gemma4" if str(config.get("model_type") or "").startswith("gemma4") else ""
    known = KNOWN_KEPT.get((quant, family)) or KNOWN_KEPT.get((quant, ""))
    if known:
        return known, f"estimate: the parts {quant} checkpoints of {family or 'this kind'} are known to keep"
    return (), ""


def facts_from_config(
    config: dict[str, Any],
    name: str,
    *,
    weight_bytes: int | None = None,
    weight_source: str = "",
    quantization: str | None = None,
    quant_file: dict[str, Any] | None = None,
    tensor_names: list[str] | None = None,
    no_weights: str = "no safetensors index available",
) -> ModelFacts:
    """Facts from a Hugging Face config.json (as a dict); missing essentials raise ModelError.
    ``quant_file``: the checkpoint's hf_quant_config.json (ModelOpt), whose exclude list says which
    layers stay in 16 bits. ``tensor_names``: the checkpoint's, where its index or headers were read
    (they show MTP layers a config does not count)."""
    if not isinstance(config, dict):
        raise ModelError(f"config.json of {name}: a JSON {type(config).__name__} where an object belongs")
    check_config(config, name)
    cfg = text_config(config)
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{name}: config.json lacks {exc} (need hidden_size, num_hidden_layers, heads)") from exc
    quant = _quantization(cfg, quantization) or _quantization_of_file(quant_file)
    notes: list[str] = []
    if weight_bytes is None:
        weight_bytes, weight_source, notes = _estimated_weights(config, quant, quant_file, no_weights)
    window, sliding_layers = _sliding(cfg, layers)
    mtp_layers = _mtp_layers(cfg, tensor_names)
    recurrent_pattern, recurrent_kind, recurrent_dims = recurrent_layout(cfg, layers)
    return ModelFacts(
        name=name,
        model_type=str(cfg.get("model_type") or ""),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        vocab_size=int(cfg.get("vocab_size") or 0),
        max_position=int(cfg["max_position_embeddings"]) if cfg.get("max_position_embeddings") else None,
        quantization=quant,
        weight_bytes=int(weight_bytes),
        weight_bytes_source=weight_source,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        num_experts=int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
        experts_per_token=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        mtp_layers=mtp_layers,
        recurrent_layers=sum(recurrent_pattern),
        recurrent_kind=recurrent_kind,
        recurrent_dims=recurrent_dims,
        notes=tuple(notes),
    )


def _estimated_weights(
    config: dict[str, Any], quant: str | None, quant_file: dict[str, Any] | None, why: str
) -> tuple[int, str, list[str]]:
    """(weight bytes, their source, the notes that say so) from the architecture, when no index or
    header gave them (``why``): the parts a quantized checkpoint keeps in 16 bits, and a vision tower."""
    cfg = text_config(config)
    kept, kept_source = quant_exclusions(cfg, quant_file, quant)
    notes = [f"weights estimated from config.json ({quant or 'unquantized'}): {why}"]
    if kept_source.startswith("estimate") and set(kept) - {"lm_head"}:  # lm_head is 16-bit here anyway
        notes.append(f"{quant} keeps {', '.join(kept)} in 16 bits ({kept_source}; no hf_quant_config.json read)")
    weight_bytes = estimate_weight_bytes(cfg, quant, kept) + estimate_vision_bytes(config)
    return weight_bytes, "estimated from the architecture", notes


def recurrent_layout(cfg: dict[str, Any], layers: int) -> tuple[tuple[bool, ...], str, tuple[int, ...]]:
    """(which layers have no KV, their kind, its dimensions) of a hybrid model, as its config.json
    says: Qwen3-Next's gated delta-net layers (``layer_types`` "linear_attention", else all but every
    ``full_attention_interval``-th), Granite 4.0-H's Mamba-2 layers (``layer_types`` "mamba")."""
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else None
    if cfg.get("linear_num_value_heads"):
        every = int(cfg.get("full_attention_interval") or 4)
        pattern = tuple(
            kinds[i] == "linear_attention" if kinds and len(kinds) == layers else (i + 1) % every != 0
            for i in range(layers)
        )
        names = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
        kernel = int(cfg.get("linear_conv_kernel_dim") or 4)
        return pattern, "gated_delta_net", (*(int(cfg[name]) for name in names), kernel)
    if cfg.get("mamba_n_heads") and kinds and len(kinds) == layers:
        inner = int(cfg.get("mamba_expand") or 2) * int(cfg["hidden_size"])
        head, state, kernel = (
            int(cfg.get(k) or d) for k, d in (("mamba_d_head", 64), ("mamba_d_state", 128), ("mamba_d_conv", 4))
        )
        dims = (inner, int(cfg.get("mamba_n_groups") or 1), int(cfg["mamba_n_heads"]), head, state, kernel)
        return tuple(kind == "mamba" for kind in kinds), "mamba2", dims
    return (), "", ()


# Families whose checkpoints ship MTP layers their config.json does not count: Qwen3-Next's
# ``mtp.layers.0`` (vLLM 0.32 models/qwen3_next_mtp.py: ``getattr(config, "num_nextn_predict_layers", 1)``)
UNCOUNTED_MTP_LAYERS = {"qwen3_next": 1}
_MTP_TENSOR = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")


def _mtp_layers(cfg: dict[str, Any], tensor_names: list[str] | None) -> int:
    """The model's own multi-token-prediction layers: config.json's ``num_nextn_predict_layers``
    (GLM-4.x, DeepSeek-V3) or ``mtp_num_hidden_layers`` (Qwen3.5); else the ``mtp.layers.N`` tensors
    where the checkpoint's names were read; else what the family is known to ship."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if cfg.get(key) is not None:
            return int(cfg[key] or 0)
    if tensor_names is not None:
        return len({found.group(1) for name in tensor_names if (found := _MTP_TENSOR.match(name))})
    return UNCOUNTED_MTP_LAYERS.get(str(cfg.get("model_type") or ""), 0)


def _quantization_of_file(quant_file: dict[str, Any] | None) -> str | None:
    """hf_quant_config.json's ``quant_algo`` (NVFP4, FP8) when config.json names no method."""
    if not isinstance(quant_file, dict):
        return None
    algo = quant_algo(quant_file)
    return "nvfp4" if "FP4" in algo else "mxfp8" if "MXFP8" in algo else "fp8" if "FP8" in algo else None
