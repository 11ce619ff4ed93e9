"""The gate in front of one engine: open, but while a long prefill is being placed there
(:mod:`gateway.serving.transport.long_pin`), when the gateway's other requests to that engine wait."""

from __future__ import annotations

import asyncio


class DispatchGate:
    """Open but while a long prefill is being placed in one engine: requests to it wait here."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    async def passed(self) -> None:
        await self._open.wait()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()
