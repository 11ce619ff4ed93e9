"""The engines the gateway knows, in order of preference: the first whose plan fits is chosen
(vLLM batches and speaks Responses/Messages natively; llama.cpp pools VRAM and RAM)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.backends import llamacpp, vllm
from gateway.backends.base import Backend, ContextOverflow, DeviceLender, FollowerHost, first_overflow
from gateway.backends.server_host import ServerHost

BACKENDS: tuple[Backend[Any, Any, Any, BaseModel], ...] = (vllm.BACKEND, llamacpp.BACKEND)


class EngineSettings(vllm.VllmSettings, llamacpp.LlamaCppSettings):
    """Every engine's own settings (``Backend.settings_model``) in one class, for the gateway's full
    settings to mix in (gateway.cli.full_settings); bases in the order of ``BACKENDS``."""


def names() -> tuple[str, ...]:
    return tuple(backend.name for backend in BACKENDS)


def get(name: str) -> Backend[Any, Any, Any, BaseModel]:
    for backend in BACKENDS:
        if backend.name == name:
            return backend
    raise KeyError(f"no engine named {name!r}: known engines are {', '.join(names())}")


# how a worker lends this node's devices to a head on another node (``gateway worker``): the first
# engine that lends any (llama.cpp's RPC servers)
LENDER: DeviceLender = next(backend.lender for backend in BACKENDS if backend.lender is not None)

# the engines whose ranks a worker runs for a head's group (vLLM across nodes, its own launcher)
FOLLOWER_HOSTS: dict[str, FollowerHost] = {
    backend.name: backend.follower_host for backend in BACKENDS if backend.follower_host is not None
}


def context_overflow(text: str) -> ContextOverflow | None:
    """An engine's "prompt too long" refusal in any engine's words (a ``--backend-url`` server may be
    either), or None when ``text`` says something else."""
    for backend in BACKENDS:
        if found := first_overflow(backend.overflow_patterns, text):
            return found
    return None


# the engines whose whole server a worker runs for a head (a replica on its node)
SERVER_HOSTS: dict[str, ServerHost] = {
    backend.name: backend.server_host for backend in BACKENDS if backend.server_host is not None
}
