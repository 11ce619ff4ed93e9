"""The catalog's ``[vllm]`` table, and the model facts vLLM plans from (config.json, never weights)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

import gateway.backends.vllm.parsers as parsers
from gateway.backends.checked import json_object
from gateway.backends.sampling import Sampling, first, from_catalog, read_generation_config
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts, facts_from_dir, facts_from_hub
from gateway.backends.vllm.hub_checkpoints import checkpoint_variants, method_of
from gateway.backends.vllm.memory import Checkpoint
from gateway.backends.vllm.parsers import Parsers
from gateway.core.errors import ModelError
from gateway.hub.guard import guard_hub

if TYPE_CHECKING:
    from gateway.core.model_entry import ModelEntry


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuantizedCheckpoint(_Strict):
    """A pre-quantized variant the planner may step down to when the original does not fit."""

    checkpoint: str
    quantization: str  # fp8 | nvfp4 | awq | gptq | mxfp4
    checkpoint_bytes: int | None = None  # unset: estimated from the architecture


class VllmSource(_Strict):
    """How vLLM gets the model: a hub repo or local directory, and the parsers agents need."""

    checkpoint: str
    checkpoint_bytes: int | None = None  # the safetensors total when known; unset: estimated
    quantized: tuple[QuantizedCheckpoint, ...] = ()
    dtype: str = "auto"
    quantization: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    discover: bool = False  # named by hub id, not in the catalog: search the hub for quantized variants


@dataclass
class VllmModel:
    """The checkpoints vLLM could load for one entry (original first), with its parsers."""

    name: str
    checkpoints: list[Checkpoint] = field(default_factory=list)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    notes: list[str] = field(default_factory=list)
    auto_parsers: Parsers | None = None  # chosen from the model's family and template (no catalog entry)
    # the model's recommended sampling: the original checkpoint's generation_config.json (which vLLM itself
    # applies at start, --generation-config auto), else the catalog's card values
    sampling: Sampling | None = None

    @property
    def max_position(self) -> int | None:
        limits = [c.facts.max_position for c in self.checkpoints if c.facts.max_position]
        return min(limits) if limits else None


def section_for(spec: str) -> dict[str, Any] | None:
    """A checkpoint directory (with config.json) or a hub repo id ``org/name`` is vLLM's to load."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return {"checkpoint": str(path.resolve())}
    named_file = spec.lower().endswith((".gguf", ".json", ".safetensors", ".bin"))
    if not path.exists() and spec.count("/") == 1 and all(spec.split("/")) and not spec.startswith((".", "~")):
        return None if named_file else {"checkpoint": spec, "discover": True}
    return None


def read(entry: ModelEntry) -> VllmModel:
    """Facts of the checkpoint and its quantized variants; a failure becomes a note, not an error."""
    source = entry.source("vllm")
    assert isinstance(source, VllmSource)
    model = VllmModel(entry.name, tool_call_parser=source.tool_call_parser, reasoning_parser=source.reasoning_parser)
    bundled = entry.bundled_config()
    try:
        model.checkpoints.append(Checkpoint(source.checkpoint, _facts(source, bundled)))
        for variant in source.quantized:
            facts = checkpoint_facts(
                bundled or _config_of(source.checkpoint),
                variant.checkpoint,
                weight_bytes=variant.checkpoint_bytes,
                weight_source="catalog" if variant.checkpoint_bytes else "",
                quantization=variant.quantization,
            )
            model.checkpoints.append(Checkpoint(variant.checkpoint, facts))
        if source.discover and not source.quantized and entry.remembered:
            _add_remembered(model, source.checkpoint, bundled, entry.remembered)
        elif source.discover and not source.quantized:
            _add_hub_checkpoints(model, source.checkpoint, bundled)
    except ModelError as exc:
        model.notes.append(f"vLLM not planned: {exc}")
    unnamed = source.tool_call_parser is None and source.reasoning_parser is None
    if model.checkpoints and unnamed and (source.discover or Path(source.checkpoint).expanduser().is_dir()):
        original = model.checkpoints[0].facts
        model.auto_parsers = parsers.choose(original.model_type, source.checkpoint, _chat_template(source.checkpoint))
        model.tool_call_parser = model.auto_parsers.tool
        model.reasoning_parser = model.auto_parsers.reasoning
    # read where config.json is read: a bundled config plans offline, and leaves the file to vLLM
    generation = read_generation_config(source.checkpoint) if bundled is None and model.checkpoints else None
    model.sampling = first(generation, from_catalog(entry))
    model.notes += [note for note in (model.sampling.notes if model.sampling else ()) if note not in model.notes]
    return model


def _add_remembered(
    model: VllmModel, checkpoint: str, bundled: dict[str, Any] | None, remembered: dict[str, Any]
) -> None:
    """A configuration worked here before: its checkpoint (if a quantized one) is the only variant
    planned besides the original, and the hub is not searched again."""
    used = str(remembered.get("memo", {}).get("checkpoint") or "")
    if remembered.get("engine") == "vllm" and used and used != checkpoint and (method := method_of(used)):
        facts = checkpoint_facts(bundled or _config_of(checkpoint), used, quantization=method)
        model.checkpoints.append(Checkpoint(used, facts))
    model.notes.append("vLLM: quantized checkpoints not searched: a configuration is remembered (--replan searches)")


def _add_hub_checkpoints(model: VllmModel, checkpoint: str, bundled: dict[str, Any] | None) -> None:
    """The hub's pre-quantized checkpoints of the model (FP8, AWQ, GPTQ, NVFP4…) as rungs after the
    original; their sizes estimated from the original's architecture at the method's bytes/weight."""
    try:
        found = checkpoint_variants(checkpoint)
    except ModelError as exc:
        model.notes.append(f"vLLM: quantized checkpoints not searched: {exc}")
        return
    config = bundled or _config_of(checkpoint)
    for variant in found:
        try:  # its own config.json and safetensors sizes when the hub has them (exact kept layers, bytes)
            facts = facts_from_hub(variant.repo)
        except ModelError:
            facts = None
        if facts is None or facts.quantization is None:  # else the original's shapes at the method's bytes
            facts = checkpoint_facts(config, variant.repo, quantization=variant.quantization)
        model.checkpoints.append(Checkpoint(variant.repo, facts))
    if found:
        names = ", ".join(f"{v.repo} ({v.quantization})" for v in found)
        model.notes.append(f"vLLM: pre-quantized checkpoints found on the hub: {names}")


def _chat_template(checkpoint: str) -> str | None:
    """The chat template: tokenizer_config.json's ``chat_template`` (a string, or named templates of
    which "default" and "tool_use" count), else chat_template.jinja; None when neither can be read."""
    path = Path(checkpoint).expanduser()
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        try:
            if path.is_dir():
                text = (path / name).read_text()
            else:
                from huggingface_hub import hf_hub_download

                guard_hub()
                text = Path(hf_hub_download(checkpoint, name)).read_text()
        except Exception:  # absent, gated or offline: the next file, else no template
            continue
        if name.endswith(".jinja"):
            return text
        try:
            template = json_object(text, f"{name} of {checkpoint}").get("chat_template")
        except ModelError:
            continue
        if isinstance(template, list):
            return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
        if isinstance(template, str):
            return template
    return None


def _facts(source: VllmSource, bundled: dict[str, Any] | None) -> CheckpointFacts:
    path = Path(source.checkpoint).expanduser()
    if path.is_dir():
        return facts_from_dir(path, source.checkpoint)
    if bundled is not None:
        origin = "catalog" if source.checkpoint_bytes else ""
        return checkpoint_facts(bundled, source.checkpoint, weight_bytes=source.checkpoint_bytes, weight_source=origin)
    return facts_from_hub(source.checkpoint)


def _config_of(checkpoint: str) -> dict[str, Any]:
    path = Path(checkpoint)
    if path.is_dir():
        return json_object((path / "config.json").read_bytes(), str(path / "config.json"))
    from huggingface_hub import hf_hub_download

    guard_hub()
    return json_object(Path(hf_hub_download(checkpoint, "config.json")).read_bytes(), f"config.json of {checkpoint}")
