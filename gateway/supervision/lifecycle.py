"""What the HTTP app fronts: a backend with a start/settle/stop lifecycle and a state to report, and
the engine its requests go to.

Two kinds implement it: the :class:`~gateway.supervision.supervisor.Supervisor` (engines the gateway starts) and
:class:`~gateway.supervision.external.ExternalBackend` (a server the user runs, ``--backend-url``). The app,
the handlers and ``/metrics`` speak only this protocol.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.backends.base import Capability, Scheduling


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class NodeStatus(enum.StrEnum):
    """A node's state in the supervisor's snapshot (``"nodes"``): gateway.nodes.survey writes it, /status
    shows it and /metrics' ``gateway_node_up`` reads it."""

    HEAD = "head"  # this machine
    NOT_SURVEYED = "not surveyed"
    IN_USE = "in use"  # it answers and the plan uses its devices
    AVAILABLE = "available"  # it answers; the plan does not use it
    LOST = "lost"  # it stopped answering while in use
    UNREACHABLE = "unreachable"


class EngineTarget(Protocol):
    """Where requests go and what the engine there does itself: the request path's part of an engine
    start (``gateway.backends.base.Launch`` is one: the start's argv and log readers are the supervisor's alone)."""

    @property
    def engine(self) -> str: ...  # the backend's name ("external" for --backend-url)
    @property
    def base_url(self) -> str: ...
    @property
    def api_key(self) -> str: ...
    @property
    def served_name(self) -> str: ...  # the model name the engine answers to
    @property
    def context_length(self) -> int: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def health_path(self) -> str: ...
    @property
    def native(self) -> frozenset[Capability]: ...  # what the engine does itself
    @property
    def reasoning_field(self) -> str | None: ...
    @property
    def tokenize_path(self) -> str | None: ...
    @property
    def tokenize_key(self) -> str: ...
    @property
    def tokenize_chat(self) -> bool: ...
    @property
    def template_path(self) -> str | None: ...
    @property
    def scheduling(self) -> Scheduling: ...  # the engine's means for many sessions at once
    @property
    def request_defaults(self) -> Mapping[str, Any]: ...  # added to a request that leaves them out (sampling)


class ServedBackend(Protocol):
    """The backend behind the gateway's routes, whatever starts it."""

    @property
    def state(self) -> State: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def ever_ready(self) -> bool: ...  # became ready at least once (a failure after that is not a start-up failure)
    @property
    def restarts(self) -> int: ...
    @property
    def retry_at(self) -> float | None: ...  # gave up restarting for now: when it tries again (seconds since the epoch)

    @property
    def ready(self) -> bool: ...
    @property
    def target(self) -> EngineTarget | None: ...  # where requests go while ready (None before any start)
    @property
    def context_length(self) -> int: ...  # the one context figure: the engine's, or the one being started
    async def start(self) -> None: ...
    async def wait_settled(self) -> State: ...  # until first ready, or given up
    async def stop(self) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...  # for /status
    def report(self) -> str: ...  # a multi-line account of why it is not serving
