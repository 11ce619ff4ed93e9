"""The gate in front of one engine: open, but while a long prefill is being placed there
(:mod:`gateway.serving.transport.long_pin`), when the gateway's other requests to that engine wait. What
reaches the engine outside the admission's slots (the liveness watch's canary) passes it too, and is
counted while it is there: the placing counts it among the requests that could take the place first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class DispatchGate:
    """Open but while a long prefill is being placed in one engine: requests to it wait here."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.outside = 0  # requests in the engine that hold no admission slot (a canary)

    async def passed(self) -> None:
        await self._open.wait()

    @contextlib.asynccontextmanager
    async def passage(self) -> AsyncIterator[None]:
        """For a request outside the admission: through the gate, counted in :attr:`outside` until it is over."""
        await self.passed()
        self.outside += 1
        try:
            yield
        finally:
            self.outside -= 1

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()
