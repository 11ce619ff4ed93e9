"""The model facts vLLM plans from: every engine's (``gateway.backends.model_facts``) with what vLLM alone
reads of a Hugging Face checkpoint (its architecture class, the vision tower, MLA's and Gemma 4's head
sizes, which parts a quantized checkpoint keeps in 16 bits), read from config.json and, where there is
one, the checkpoint's directory or the hub's safetensors index (never the weights)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gateway.backends.checked import integer, json_object
from gateway.backends.model_facts import (
    ModelFacts,
    estimate_vision_bytes,
    estimate_weight_bytes,
    facts_from_config,
    quant_algo,
    quant_exclusions,
    text_config,
)
from gateway.core.errors import ModelError


@dataclass(frozen=True)
class CheckpointFacts(ModelFacts):
    """The model's facts with what only vLLM reads of a checkpoint's config.json and
    hf_quant_config.json (a GGUF carries none of it)."""

    dtype: str = "bfloat16"  # of the unquantized parts: bfloat16 | float16 | float32
    architecture: str = ""  # the class the engine's model registry is asked for
    vision_bytes: int = 0  # part of weight_bytes that is a vision/audio tower
    qk_nope_head_dim: int = 0  # MLA run without MLA stores full K (nope + rope) and V heads
    v_head_dim: int = 0
    # the head size and KV heads of the full-attention layers where they differ (Gemma 4: 512; 0: as
    # head_dim and num_kv_heads)
    global_head_dim: int = 0
    global_kv_heads: int = 0
    # which parts a quantized checkpoint keeps in 16 bits ("attention", "mlp", "lm_head", "vision") and
    # where that list came from (hf_quant_config.json, config.json, or a known list: an estimate)
    quant_kept: tuple[str, ...] = ()
    quant_kept_source: str = ""
    # how the checkpoint names its quantization (config.json quant_method, ModelOpt's quant_algo):
    # the engine's minimum compute capability depends on it, not on the storage format alone
    quant_method: str = ""
    quant_algo: str = ""
    # the multi-token-prediction layers' bytes: in the checkpoint's safetensors (weight_bytes includes
    # them unless estimated)
    mtp_bytes: int = 0

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2


def checkpoint_facts(
    config: dict[str, Any],
    name: str,
    *,
    weight_bytes: int | None = None,
    weight_source: str = "",
    quantization: str | None = None,
    quant_file: dict[str, Any] | None = None,
    tensor_names: list[str] | None = None,
    no_weights: str = "no safetensors index available",
) -> CheckpointFacts:
    """Every engine's facts from config.json (``facts_from_config``, which takes the same arguments),
    with vLLM's own read from the same config.json and hf_quant_config.json."""
    facts = facts_from_config(
        config,
        name,
        weight_bytes=weight_bytes,
        weight_source=weight_source,
        quantization=quantization,
        quant_file=quant_file,
        tensor_names=tensor_names,
        no_weights=no_weights,
    )
    cfg = text_config(config)
    kept, kept_source = quant_exclusions(cfg, quant_file, facts.quantization)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    found = cfg.get("quantization_config")
    qc: dict[str, Any] = found if isinstance(found, dict) else {}
    return CheckpointFacts(
        **{f.name: getattr(facts, f.name) for f in fields(ModelFacts)},
        dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
        architecture=str((config.get("architectures") or [""])[0]),
        vision_bytes=estimate_vision_bytes(config),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        global_head_dim=int(cfg.get("global_head_dim") or 0),
        global_kv_heads=int(cfg.get("num_global_key_value_heads") or 0),
        quant_kept=kept,
        quant_kept_source=kept_source,
        quant_method=str(qc.get("quant_method") or ("modelopt" if quant_file else "")).lower(),
        quant_algo=quant_algo(qc) or (quant_algo(quant_file) if isinstance(quant_file, dict) else ""),
        mtp_bytes=facts.mtp_layers * _mtp_layer_bytes(cfg, facts.quantization, kept),
    )


def _mtp_layer_bytes(cfg: dict[str, Any], quantization: str | None, kept: tuple[str, ...]) -> int:
    """One multi-token-prediction layer: a decoder layer like the last one (MoE where the model is)
    plus its projection of [embedding; hidden] (2h × h, 16-bit) and norms. An estimate."""
    layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    one_more = {**cfg, "num_hidden_layers": layers + 1}
    per_layer = estimate_weight_bytes(one_more, quantization, kept) - estimate_weight_bytes(cfg, quantization, kept)
    return per_layer + 2 * hidden * hidden * 2 + 3 * hidden * 2


SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own limit (safetensors' MAX_HEADER_SIZE)


def _safetensors_header(path: Path) -> dict[str, Any]:
    """One shard's header: each tensor's dtype, shape and offsets (the weights themselves are not read)."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > SAFETENSORS_MAX_HEADER:
            raise ModelError(f"{path}: a safetensors header of {length:,} bytes (at most {SAFETENSORS_MAX_HEADER:,})")
        return json_object(handle.read(length), str(path))


MAX_WEIGHT_BYTES = 1 << 50  # a pebibyte: no checkpoint is larger


def _tensor_bytes(header: dict[str, Any]) -> int:
    """Sum of the tensor sizes a shard's header declares."""
    return sum(
        end - start for key, value in header.items() if key != "__metadata__" for start, end in [value["data_offsets"]]
    )


def weights_read(total: int, names: list[str] | None, where: str) -> int:
    """The weight bytes an index or headers gave, when they describe weights: an index that lists no
    tensor, or offsets adding up to nothing, negative or beyond any checkpoint, raises ModelError
    (the caller estimates from config.json instead and says why)."""
    if names is not None and not names:
        raise ModelError(f"{where} lists no tensors")
    if not 0 < total <= MAX_WEIGHT_BYTES:
        raise ModelError(f"{where} gives {total:,} bytes of weights")
    return total


def _hub_weights(repo: str) -> tuple[int | None, list[str] | None, str]:
    """(weight bytes, tensor names, why not) from the hub's safetensors index or headers."""
    from huggingface_hub import get_safetensors_metadata
    from huggingface_hub.errors import NotASafetensorsRepoError

    try:
        metadata = get_safetensors_metadata(repo)
        offsets = [info.data_offsets for shard in metadata.files_metadata.values() for info in shard.tensors.values()]
        if any(not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b) for a, b in offsets):
            raise ModelError(f"the safetensors headers of {repo} give impossible offsets")
        names = list(metadata.weight_map)
        return weights_read(sum(b - a for a, b in offsets), names, f"the safetensors index of {repo}"), names, ""
    except NotASafetensorsRepoError:
        return None, None, "no safetensors index available"
    except Exception as exc:  # unreadable index or headers, or ones that describe no weights
        why = str(exc).splitlines()[0][:200] if isinstance(exc, ModelError) else type(exc).__name__
        return None, None, f"the hub's safetensors index or headers were not usable ({why})"


def facts_from_dir(directory: Path, name: str | None = None) -> CheckpointFacts:
    config_path = directory / "config.json"
    try:
        config = json_object(config_path.read_bytes(), str(config_path))
    except OSError as exc:
        raise ModelError(f"cannot read {config_path}: {exc}") from exc
    index = directory / "model.safetensors.index.json"
    weight_bytes: int | None = None
    source = ""
    names: list[str] | None = None
    unusable = "no safetensors index available"
    try:
        if index.is_file():
            read = json_object(index.read_bytes(), str(index))
            meta, mapped = read.get("metadata"), read.get("weight_map")
            total = meta.get("total_size") if isinstance(meta, dict) else None
            names = list(mapped) if isinstance(mapped, dict) and mapped else None
            if total:
                weight_bytes = weights_read(
                    integer(total, str(index), "metadata.total_size", 1, MAX_WEIGHT_BYTES), names, str(index)
                )
                source = "safetensors index"
        shards = sorted(directory.glob("*.safetensors"))
        if weight_bytes is None and shards:
            headers = [_safetensors_header(shard) for shard in shards]
            names = [key for header in headers for key in header if key != "__metadata__"]
            weight_bytes = weights_read(
                sum(_tensor_bytes(h) for h in headers), names, f"the safetensors headers in {directory}"
            )
            source = "safetensors headers"
    except (ModelError, OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        weight_bytes, source, names = None, "", None
        unusable = f"the safetensors index or headers were not usable ({str(exc)[:200]})"
    quant_file = directory / "hf_quant_config.json"
    try:
        quant = json_object(quant_file.read_bytes(), str(quant_file)) if quant_file.is_file() else None
    except (OSError, ModelError):
        quant = None
    return checkpoint_facts(
        config,
        name or directory.name,
        weight_bytes=weight_bytes,
        weight_source=source,
        quant_file=quant,
        tensor_names=names,
        no_weights=unusable,
    )


def facts_from_hub(repo: str) -> CheckpointFacts:
    """config.json and the safetensors index (or header metadata) from the hub; never the weights. An
    index that lists no tensors or headers that cannot be parsed leave the weights estimated from
    config.json, and the facts say so."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError

    from gateway.hub.errors import hub_error
    from gateway.hub.guard import UntrustedAnswer, guard_hub

    guard_hub()
    try:
        config = json_object(Path(hf_hub_download(repo, "config.json")).read_bytes(), f"config.json of {repo}")
    except (GatedRepoError, UntrustedAnswer) as exc:  # the fix is the user's licence and token, not the network
        raise hub_error(repo, exc) from exc
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise ModelError(
            f"cannot read config.json of {repo} from the hub ({type(exc).__name__}): check the network "
            "or HF_TOKEN, or pass a local checkpoint directory"
        ) from exc
    weight_bytes, names, why = _hub_weights(repo)
    try:  # ModelOpt checkpoints name their 16-bit layers here
        quant: dict[str, Any] | None = json_object(
            Path(hf_hub_download(repo, "hf_quant_config.json")).read_bytes(), f"hf_quant_config.json of {repo}"
        )
    except Exception:  # most checkpoints have none
        quant = None
    return checkpoint_facts(
        config,
        repo,
        weight_bytes=weight_bytes,
        weight_source="hub safetensors metadata" if weight_bytes else "",
        quant_file=quant,
        tensor_names=names,
        no_weights=why,
    )
