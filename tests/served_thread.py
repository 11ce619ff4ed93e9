"""uvicorn in a test's thread, stopped at once.

Why one helper: every test server (the stand-in engines, the local hub, the hostile hub's recorders)
stops at the end of its test or module, and uvicorn's own stop waits out its 0.1 s tick and then a
fixed 0.1 s pause: about 0.2 s of nothing per server, on the critical path of the fast suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn


class WakeableServer(uvicorn.Server):
    """uvicorn's server, stopped at once: uvicorn's main loop looks at ``should_exit`` every 0.1 s and
    its shutdown pauses 0.1 s more, and the suite stops some 50 servers (5 s of pauses)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()
        await super().startup(sockets=sockets)

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # the Date header each second, should_exit
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 0.1)

    def stop(self) -> None:
        self.should_exit = True
        with contextlib.suppress(AttributeError, RuntimeError):  # not started yet, or its loop already closed
            self._loop.call_soon_threadsafe(self._woken.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown without its fixed pause after asking each connection to close: the wait
        for the connections and tasks that follows lasts as long as they take."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await asyncio.sleep(0)  # the closed connections' callbacks
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._wait_tasks_to_complete()
        except TimeoutError:
            for task in self.server_state.tasks:
                task.cancel()
        if not self.force_exit:
            await self.lifespan.shutdown()
