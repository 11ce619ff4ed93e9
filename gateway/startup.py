"""From settings to the ordered options the supervisor will try: plan first, then make it startable.

vLLM options are the plan's fitting rungs, best first (a few, so a failure has somewhere to step
down to); the llama.cpp placement comes after them as the fallback. Flags the user gave are pinned:
when the plan says they do not fit, they are still tried first (the user asked), with a warning,
and the engine's own numbers decide the step down.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends import llamacpp, vllm
from gateway.artifacts import ensure_gguf
from gateway.catalog import DEFAULT_MODEL, Catalog, ModelEntry, catalog_with
from gateway.errors import BackendError, ConfigError
from gateway.hardware import Inventory, inventory
from gateway.known_good import KnownGood
from gateway.planner import ModelSources, Plan, Policy, gather
from gateway.planner import decide as plan_decide
from gateway.routing import ModelRoute
from gateway.settings import Settings
from backends.base import Option
from gateway.supervisor import Remember, remembered_first

log = logging.getLogger("gateway.startup")

VLLM_OPTIONS = 4  # rungs to try before falling back
_PINNABLE = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_num_seqs",
    "tensor_parallel_size",
    "enforce_eager",
    "kv_cache_dtype",
)


@dataclass(frozen=True)
class Decision:
    entry: ModelEntry
    route: ModelRoute
    options: list[Option]
    plan: Plan
    remember: Remember


def choose_model(settings: Settings, catalog: Catalog, gpu_count: int) -> ModelEntry:
    if settings.model:
        return catalog.resolve(settings.model)
    if gpu_count:
        raise ConfigError(f"{gpu_count} GPU(s) found but no model given: pass --model NAME (see `gateway models`)")
    log.info("no model given and no GPU: serving the embedded default %s", DEFAULT_MODEL)
    return catalog.resolve(DEFAULT_MODEL)


def serve_policy(
    settings: Settings, entry: ModelEntry, sources: ModelSources, has_gpus: bool, cpu_vllm: bool
) -> Policy:
    """Pinned flags from the settings; the context capped at 32768 on a CPU unless given."""
    maxima = [entry.max_context] + [c.facts.max_position for c in sources.vllm_checkpoints]
    maxima += [sources.gguf_facts.max_position if sources.gguf_facts else None]
    limit = min((m for m in maxima if m), default=None)
    pinned: dict[str, Any] = {
        name: getattr(settings, name) for name in _PINNABLE if getattr(settings, name) is not None
    }
    if settings.context_length is not None:
        if limit is not None and settings.context_length > limit:
            raise ConfigError(
                f"context_length {settings.context_length} exceeds {entry.name}'s maximum of {limit}: "
                f"pass --context-length {limit} or less"
            )
        pinned |= {"max_model_len": settings.context_length, "n_ctx": settings.context_length}
        minimum = min(settings.min_context, settings.context_length)
        return Policy(min_context=minimum, pinned=pinned, cpu_vllm=cpu_vllm, vllm_version=settings.vllm_version)
    top = limit or llamacpp.FALLBACK_CONTEXT
    cap = top if has_gpus else min(top, llamacpp.CPU_CONTEXT_CAP)
    return Policy(
        min_context=min(settings.min_context, cap),
        max_context=cap,
        pinned=pinned,
        cpu_vllm=cpu_vllm,
        vllm_version=settings.vllm_version,
    )


def _vllm_options(plan: Plan, sources: ModelSources, command: list[str], version: str, policy: Policy) -> list[Option]:
    chosen = vllm.ranked(plan.vllm_candidates)[:VLLM_OPTIONS]
    if not chosen and policy.pinned and plan.vllm_candidates:
        first = plan.vllm_candidates[0]
        log.warning("the plan says the pinned vLLM flags do not fit (%s); trying them as asked", first.reason)
        chosen = [first]
    return [
        vllm.VllmOption(
            checkpoint=c.checkpoint.name,
            flags=c.flags,
            served_name=sources.name,
            command=tuple(command),
            tool_call_parser=sources.tool_call_parser,
            reasoning_parser=sources.reasoning_parser,
            min_context=policy.min_context,
            version=version,
            on_cpu=not plan.inventory.gpus,
        )
        for c in chosen
    ]


def _llamacpp_option(plan: Plan, entry: ModelEntry, settings: Settings) -> Option | None:
    chosen = llamacpp.best(plan.llamacpp_candidates)
    if chosen is None or entry.llamacpp is None:
        return None
    source = entry.llamacpp
    local = Path(chosen.checkpoint)
    fetch = None if local.is_file() else (lambda: ensure_gguf(source))
    config = llamacpp.LlamaCppConfig(
        gguf=local,
        served_name=entry.name,
        context_length=chosen.n_ctx,
        chat_format=source.chat_format,
        gpu_layers=chosen.placement.n_gpu_layers,
        tensor_split=chosen.placement.tensor_split,
        kv_type=chosen.kv_type,
        threads=settings.threads or os.cpu_count(),
        launcher=chosen.launcher,
        n_cpu_moe=chosen.placement.n_cpu_moe,
    )
    if chosen.launcher == "native":
        command = settings.llama_server_command or ["llama-server"]
    else:
        command = settings.llama_cpp_python_command or llamacpp.default_command()
    return llamacpp.LlamaCppOption(config=config, command=tuple(command), fetch=fetch)


def decide(settings: Settings, catalog: Catalog | None = None, machine: Inventory | None = None) -> Decision:
    catalog = catalog or catalog_with(settings.catalog_dir)
    machine = machine or inventory()
    entry = choose_model(settings, catalog, len(machine.gpus))
    command, detected = vllm.detect(settings.vllm_command) if entry.vllm else (None, None)
    version = settings.vllm_version or detected or vllm.DEFAULT_VERSION
    sources = gather(entry)
    cpu_vllm = command is not None and vllm.is_cpu_build(detected)
    policy = serve_policy(settings, entry, sources, bool(machine.gpus), cpu_vllm)
    native = settings.llama_server_command or (["llama-server"] if shutil.which("llama-server") else None)
    if native:
        policy = replace(policy, launcher="native")
    plan = plan_decide(sources, machine, policy)
    for note in plan.notes:
        if note not in machine.notes:  # the inventory's own notes were logged when it was read
            log.info("plan: %s", note)
    options: list[Option] = []
    if command is not None:
        options += _vllm_options(plan, sources, command, version, policy)
    elif entry.vllm is not None and plan.vllm_candidates:
        log.warning(
            "vLLM would serve %s but is not installed: pip install 'gateway[vllm]' or set vllm_command", entry.name
        )
    if fallback := _llamacpp_option(plan, entry, settings):
        options.append(fallback)
    if not options:
        raise BackendError(f"{entry.name} cannot be served here: {plan.decision_reason}")
    remember = Remember(
        store=KnownGood(settings.state_dir),
        model=entry.name,
        fingerprint=machine.fingerprint,
        versions={"vllm": version, "llamacpp": llamacpp.installed_version() or "unknown"},
    )
    if not settings.replan:
        options = remembered_first(options, remember, lambda memo: _rebuild(options, memo))
    route = ModelRoute(
        fronted=entry.name, served=entry.name, context_length=options[0].context_length, aliases=entry.aliases
    )
    return Decision(entry=entry, route=route, options=options, plan=plan, remember=remember)


def _rebuild(options: list[Option], entry: dict[str, Any]) -> Option | None:
    """The remembered configuration, on top of the current option of the same engine."""
    for option in options:
        if option.engine == entry.get("engine"):
            try:
                return option.from_memo(entry["memo"])
            except (KeyError, TypeError, ValueError):
                return None
    return None
