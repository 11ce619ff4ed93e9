"""Stopping without dropping anyone silently (SIGTERM, Ctrl-C).

uvicorn stops accepting connections and waits for the ones open; before it does, the gateway:
answers every queued request 503 + Retry-After at once (the engine is going away: retry after the
restart, or elsewhere), lets requests in flight run for ``shutdown_grace_s``, then cuts what is left
of them: a stream ends with an error event in its dialect, a request still waiting for its answer
gets a 503 in its dialect. uvicorn's own deadline comes a little later, so that those last words are
written before it cancels anything.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

from gateway.serving.runtime import Runtime

log = logging.getLogger("gateway.drain")

STOPPING = "the gateway is shutting down; retry shortly"
LAST_WORDS_S = 3  # uvicorn's deadline after the grace: time for the cut requests to answer


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the gateway's drain at the start of its shutdown."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, grace_s: float) -> None:
        config.timeout_graceful_shutdown = int(grace_s) + LAST_WORDS_S
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s
        self._cut: asyncio.Task[None] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._cut = asyncio.create_task(drain(self.runtime, self.grace_s), name="drain")
        await super().shutdown(sockets)
        if not self._cut.done():
            self._cut.cancel()


async def drain(runtime: Runtime, grace_s: float) -> None:
    """Queued requests: 503 now; in flight: ``grace_s`` to finish, then cut with an error (on every replica)."""
    upstreams = runtime.upstreams
    active = sum(upstream.admission.active for upstream in upstreams)
    log.info(
        "stopping: %d requests in flight get %g s to finish, %d queued are told to retry",
        active, grace_s, sum(upstream.admission.queued for upstream in upstreams),
    )  # fmt: skip
    for upstream in upstreams:
        upstream.admission.close(STOPPING)
    await asyncio.sleep(grace_s)
    if active := sum(upstream.admission.active for upstream in upstreams):
        log.warning("stopping: %d requests still in flight after %g s are cut", active, grace_s)
    for upstream in upstreams:
        await upstream.client.cut_all(STOPPING)
