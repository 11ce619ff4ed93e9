"""What the planner needs to know about a model, from whichever source has it.

Sources, in order: the catalog entry (a bundled config.json and, when known, the checkpoint's bytes);
a local directory (config.json + safetensors index or shard headers; weights need not be present);
the hub (config.json and the safetensors index, cached by huggingface_hub, no weights); a GGUF file
(header and tensor table). When no source gives the weight bytes they are estimated from the
architecture, and the facts say so.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import ModelError
from gateway.modelinfo import GgufHeader

# bytes per weight for linear layers by checkpoint quantization (scales and zero points included)
_LINEAR_BYTES = {
    None: 2.0,
    "fp8": 1.0 + 4 / (128 * 128),  # block-wise scales
    "awq": 0.5 + 2.5 / 128,  # int4 + fp16 scale + int4 zero per group of 128
    "gptq": 0.5 + 2.5 / 128,
    "mxfp4": 0.5 + 1 / 32,  # e8m0 scale per 32
    "nvfp4": 0.5 + 1 / 16 + 0.0,  # fp8 scale per 16
    "int8": 1.0 + 2 / 128,
}
# compute capability each quantization needs on NVIDIA GPUs (vLLM's kernels)
MIN_CAPABILITY = {"fp8": (8, 9), "nvfp4": (10, 0), "mxfp4": (8, 0), "awq": (7, 5), "gptq": (7, 0), "int8": (7, 5)}


@dataclass(frozen=True)
class ModelFacts:
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
    dtype: str  # of the unquantized parts: bfloat16 | float16 | float32
    quantization: str | None
    weight_bytes: int
    weight_bytes_source: str
    kv_lora_rank: int = 0  # MLA latent size (0: not an MLA model)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0  # MLA run without MLA stores full K (nope + rope) and V heads
    v_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers use the sliding window
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    vision_bytes: int = 0  # part of weight_bytes that is a vision/audio tower
    # GGUF only: per-block bytes, expert bytes per block, token embedding and output bytes
    layer_bytes: tuple[int, ...] = ()
    expert_layer_bytes: tuple[int, ...] = ()
    embedding_bytes: int = 0
    output_bytes: int = 0
    gguf_key_length: int = 0
    gguf_value_length: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model; its fields win, the outer ones fill gaps."""
    inner = config.get("text_config") or config.get("llm_config") or {}
    return {**config, **inner} if isinstance(inner, dict) else config


def _quantization(config: dict[str, Any], override: str | None) -> str | None:
    if override:
        return override.lower()
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method in ("modelopt", "modelopt_fp4") or "fp4" in str(qc.get("quant_algo", "")).lower():
        return "nvfp4"
    if method == "compressed-tensors":
        text = json.dumps(qc).lower()
        return (
            "nvfp4"
            if "nvfp4" in text or '"num_bits": 4, "type": "float"' in text
            else "fp8"
            if "float" in text
            else "int8"
        )
    return method or None


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


def estimate_weight_bytes(cfg: dict[str, Any], quantization: str | None) -> int:
    """Parameter count from the architecture × bytes per parameter; embeddings stay 16-bit."""
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg.get("vocab_size") or 0)
    if cfg.get("kv_lora_rank"):
        q_rank = cfg.get("q_lora_rank")
        qk_head = int(cfg.get("qk_nope_head_dim", 0)) + int(cfg.get("qk_rope_head_dim", 0))
        v_head = int(cfg.get("v_head_dim", head_dim))
        q = hidden * int(q_rank) + int(q_rank) * heads * qk_head if q_rank else hidden * heads * qk_head
        kv = hidden * (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0)))
        kv += int(cfg["kv_lora_rank"]) * heads * (int(cfg.get("qk_nope_head_dim", 0)) + v_head)
        attention = q + kv + heads * v_head * hidden
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
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
    linear = layers * attention + mlp
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    norms = layers * 2 * hidden + hidden
    return int(linear * _LINEAR_BYTES.get(quantization, 2.0) + (embeddings + norms) * 2)


def facts_from_config(
    config: dict[str, Any],
    name: str,
    *,
    weight_bytes: int | None = None,
    weight_source: str = "",
    quantization: str | None = None,
) -> ModelFacts:
    """Facts from a Hugging Face config.json (as a dict); missing essentials raise ModelError."""
    cfg = _text_config(config)
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{name}: config.json lacks {exc} (need hidden_size, num_hidden_layers, heads)") from exc
    quant = _quantization(cfg, quantization)
    notes: list[str] = []
    if weight_bytes is None:
        weight_bytes = estimate_weight_bytes(cfg, quant)
        weight_source = "estimated from the architecture"
        notes.append(f"weights estimated from config.json ({quant or 'unquantized'}): no safetensors index available")
    window, sliding_layers = _sliding(cfg, layers)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
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
        dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
        quantization=quant,
        weight_bytes=int(weight_bytes),
        weight_bytes_source=weight_source,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        num_experts=int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
        experts_per_token=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        notes=tuple(notes),
    )


def _safetensors_header_bytes(path: Path) -> int:
    """Sum of tensor sizes declared in one shard's header (the weights themselves are not read)."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return sum(
        end - start for key, value in header.items() if key != "__metadata__" for start, end in [value["data_offsets"]]
    )


def facts_from_dir(directory: Path, name: str | None = None) -> ModelFacts:
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {config_path}: {exc}") from exc
    index = directory / "model.safetensors.index.json"
    weight_bytes: int | None = None
    source = ""
    if index.is_file():
        weight_bytes = int(json.loads(index.read_text()).get("metadata", {}).get("total_size") or 0) or None
        source = "safetensors index"
    shards = sorted(directory.glob("*.safetensors"))
    if weight_bytes is None and shards:
        weight_bytes, source = sum(_safetensors_header_bytes(shard) for shard in shards), "safetensors headers"
    return facts_from_config(config, name or directory.name, weight_bytes=weight_bytes, weight_source=source)


def facts_from_hub(repo: str) -> ModelFacts:
    """config.json and the safetensors index (or header metadata) from the hub; never the weights."""
    from huggingface_hub import get_safetensors_metadata, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        config = json.loads(Path(hf_hub_download(repo, "config.json")).read_text())
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read config.json of {repo} from the hub ({type(exc).__name__}): check the network "
            "or HF_TOKEN, or pass a local checkpoint directory"
        ) from exc
    try:
        metadata = get_safetensors_metadata(repo)
        weight_bytes: int | None = sum(
            sum(info.data_offsets[1] - info.data_offsets[0] for info in shard.tensors.values())
            for shard in metadata.files_metadata.values()
        )
        source = "hub safetensors metadata"
    except Exception:  # no safetensors on the hub: estimate from the architecture instead
        weight_bytes, source = None, ""
    return facts_from_config(config, repo, weight_bytes=weight_bytes, weight_source=source)


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
    from dataclasses import replace

    cfg = _text_config(config)
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
