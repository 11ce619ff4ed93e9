"""Running an HTTP server until a stop is asked for: one way for `serve` and `worker`.

uvicorn handles SIGINT/SIGTERM while serving and re-raises them once it has shut down; these handlers receive
that re-raise (and any signal before uvicorn takes over) so that a requested stop, completed cleanly, exits 0
instead of dying by the signal. SIGHUP (the terminal closed, or a service manager's reload) gets the same
stop: uvicorn leaves it alone, and by default it kills, leaving a drain or a child's orderly stop undone."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_served(
    server: uvicorn.Server, main: Coroutine[Any, Any, None], on_stop: Callable[[int], None] | None = None
) -> None:
    """Run ``main`` (``server.serve(...)``, or a coroutine around it) on the loop uvicorn would pick itself
    (uvloop when installed) until it ends; a stop signal calls ``on_stop`` with its number, then asks the
    server to exit. The previous handlers are back afterwards."""

    def stop_requested(signum: int, _frame: object) -> None:
        if on_stop is not None:
            on_stop(signum)
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop_requested) for sig in STOP_SIGNALS}
    try:
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            runner.run(main)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
