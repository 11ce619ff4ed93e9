"""From settings to a decided backend launch: which model, which file, which placement, which argv.

The fit planner decides where llama.cpp puts the model (GPU layers, tensor split, KV type, context);
this module turns its choice into a launch. Starting vLLM belongs to the supervisor (not yet), so
`serve` plans llama.cpp only and says so when vLLM would have been the better choice.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass

from backends import llamacpp
from backends.base import Launch
from gateway.artifacts import ensure_gguf
from gateway.catalog import DEFAULT_MODEL, Catalog, ModelEntry, builtin_catalog
from gateway.errors import BackendError, ConfigError, ModelError
from gateway.hardware import Inventory, inventory
from gateway.modelfacts import facts_from_gguf
from gateway.modelinfo import read_gguf_header
from gateway.planner import ModelSources, Plan, Policy
from gateway.planner import decide as plan_decide
from gateway.process import free_port
from gateway.routing import ModelRoute
from gateway.settings import Settings

log = logging.getLogger("gateway.startup")

DEFAULT_MIN_CONTEXT = 32768


@dataclass(frozen=True)
class Decision:
    entry: ModelEntry
    route: ModelRoute
    launch: Launch
    plan: Plan


def choose_model(settings: Settings, catalog: Catalog, gpu_count: int) -> ModelEntry:
    if settings.model:
        return catalog.resolve(settings.model)
    if gpu_count:
        raise ConfigError(f"{gpu_count} GPU(s) found but no model given: pass --model NAME (see `gateway models`)")
    log.info("no model given and no GPU: serving the embedded default %s", DEFAULT_MODEL)
    return catalog.resolve(DEFAULT_MODEL)


def context_policy(settings: Settings, entry: ModelEntry, model_max: int | None, has_gpus: bool) -> Policy:
    """The user's --context-length is pinned (refused above the model's maximum); otherwise the
    planner picks the longest that fits, capped at 32768 on a CPU where long prompts crawl."""
    limit = entry.max_context or model_max
    if settings.context_length is not None:
        if limit is not None and settings.context_length > limit:
            raise ConfigError(
                f"context_length {settings.context_length} exceeds {entry.name}'s maximum of {limit}: "
                f"pass --context-length {limit} or less"
            )
        n_ctx = settings.context_length
        return Policy(min_context=n_ctx, backend="llamacpp", pinned={"n_ctx": n_ctx})
    top = limit or llamacpp.FALLBACK_CONTEXT
    cap = None if has_gpus else llamacpp.CPU_CONTEXT_CAP
    return Policy(
        min_context=min(DEFAULT_MIN_CONTEXT, top, cap or top), max_context=min(top, cap or top), backend="llamacpp"
    )


def decide(settings: Settings, catalog: Catalog | None = None, machine: Inventory | None = None) -> Decision:
    catalog = catalog or builtin_catalog()
    machine = machine or inventory()
    entry = choose_model(settings, catalog, len(machine.gpus))
    if entry.llamacpp is None:
        raise ModelError(
            f"{entry.name} has no GGUF for llama.cpp and `gateway serve` does not start vLLM yet: "
            "pass a catalog model with a GGUF or --model /path/to/file.gguf"
        )
    command = settings.llama_cpp_python_command or llamacpp.default_command()
    gguf = ensure_gguf(entry.llamacpp)
    header = read_gguf_header(gguf)
    facts = facts_from_gguf(header, entry.name)
    if entry.llamacpp.chat_format is None and not header.has_chat_template:
        log.warning("%s has no chat template and the catalog names no chat_format: llama.cpp will guess", gguf.name)
    policy = context_policy(settings, entry, facts.max_position, bool(machine.gpus))
    sources = ModelSources(
        name=entry.name, gguf_facts=facts, gguf_name=str(gguf), chat_format=entry.llamacpp.chat_format
    )
    plan = plan_decide(sources, machine, policy)
    chosen = plan.chosen
    if not isinstance(chosen, llamacpp.LlamaCppCandidate):
        raise BackendError(f"{entry.name} does not fit this machine: {plan.decision_reason}")
    placement = chosen.placement
    config = llamacpp.LlamaCppConfig(
        gguf=gguf,
        served_name=entry.name,
        context_length=chosen.n_ctx,
        chat_format=entry.llamacpp.chat_format,
        gpu_layers=placement.n_gpu_layers,
        tensor_split=placement.tensor_split,
        kv_type=chosen.kv_type,
        threads=settings.threads or os.cpu_count(),
    )
    log.info("plan: %s", chosen.reason)
    launch = llamacpp.build_launch(config, port=free_port(), api_key=secrets.token_urlsafe(24), command=command)
    route = ModelRoute(
        fronted=entry.name, served=launch.served_name, context_length=chosen.n_ctx, aliases=entry.aliases
    )
    return Decision(entry=entry, route=route, launch=launch, plan=plan)
