"""What the HTTP app fronts: a backend with a start/settle/stop lifecycle and a state to report.

Two kinds implement it: the :class:`~gateway.supervision.supervisor.Supervisor` (engines the gateway starts) and
:class:`~gateway.serving.external.ExternalBackend` (a server the user runs, ``--backend-url``). The app,
the handlers and ``/metrics`` speak only this protocol.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from backends.base import Launch


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class ServedBackend(Protocol):
    """The backend behind the gateway's routes, whatever starts it."""

    state: State
    reason: str | None
    ever_ready: bool  # became ready at least once (a failure after that is not a start-up failure)
    restarts: int

    @property
    def ready(self) -> bool: ...
    @property
    def launch(self) -> Launch | None: ...  # where requests go while ready
    @property
    def context_length(self) -> int: ...  # the one context figure: the engine's, or the one being started
    async def start(self) -> None: ...
    async def wait_settled(self) -> State: ...  # until first ready, or given up
    async def stop(self) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...  # for /status
    def report(self) -> str: ...  # a multi-line account of why it is not serving
