"""From settings to a decided backend launch: which model, which file, which context, which argv.

Until the planner lands this is the CPU path: llama.cpp through llama-cpp-python with every layer
on the CPU and the context the model allows (capped for CPUs), or the one the user asked for.
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
from gateway.errors import ConfigError, ModelError
from gateway.hardware import nvidia_gpu_count
from gateway.modelinfo import read_gguf_header
from gateway.process import free_port
from gateway.routing import ModelRoute
from gateway.settings import Settings

log = logging.getLogger("gateway.startup")


@dataclass(frozen=True)
class Decision:
    entry: ModelEntry
    route: ModelRoute
    launch: Launch


def choose_model(settings: Settings, catalog: Catalog, gpu_count: int) -> ModelEntry:
    if settings.model:
        return catalog.resolve(settings.model)
    if gpu_count:
        raise ConfigError(f"{gpu_count} GPU(s) found but no model given: pass --model NAME (see `gateway models`)")
    log.info("no model given and no GPU: serving the embedded default %s", DEFAULT_MODEL)
    return catalog.resolve(DEFAULT_MODEL)


def context_for(settings: Settings, entry: ModelEntry, model_max: int | None) -> int:
    limit = entry.max_context or model_max
    if settings.context_length is not None:
        if limit is not None and settings.context_length > limit:
            raise ConfigError(
                f"context_length {settings.context_length} exceeds {entry.name}'s maximum of {limit}: "
                f"pass --context-length {limit} or less"
            )
        return settings.context_length
    if limit is None:
        return llamacpp.FALLBACK_CONTEXT
    return min(limit, llamacpp.CPU_CONTEXT_CAP)


def decide(settings: Settings, catalog: Catalog | None = None, gpu_count: int | None = None) -> Decision:
    catalog = catalog or builtin_catalog()
    gpus = nvidia_gpu_count() if gpu_count is None else gpu_count
    entry = choose_model(settings, catalog, gpus)
    if entry.llamacpp is None:
        raise ModelError(
            f"{entry.name} has no GGUF for llama.cpp and `gateway serve` does not start vLLM yet: "
            "pass a catalog model with a GGUF or --model /path/to/file.gguf"
        )
    command = settings.llama_cpp_python_command or llamacpp.default_command()
    gguf = ensure_gguf(entry.llamacpp)
    header = read_gguf_header(gguf)
    context_length = context_for(settings, entry, header.context_length)
    chat_format = entry.llamacpp.chat_format
    if chat_format is None and not header.has_chat_template:
        log.warning("%s has no chat template and the catalog names no chat_format: llama.cpp will guess", gguf.name)
    config = llamacpp.LlamaCppConfig(
        gguf=gguf,
        served_name=entry.name,
        context_length=context_length,
        chat_format=chat_format,
        threads=settings.threads or os.cpu_count(),
    )
    launch = llamacpp.build_launch(config, port=free_port(), api_key=secrets.token_urlsafe(24), command=command)
    route = ModelRoute(
        fronted=entry.name, served=launch.served_name, context_length=context_length, aliases=entry.aliases
    )
    return Decision(entry=entry, route=route, launch=launch)
