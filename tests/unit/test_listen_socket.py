"""The gateway's listening socket must say it is TCP, or asyncio leaves Nagle on for every connection
(seen: each keep-alive response waited 40 ms for a delayed ACK)."""

from __future__ import annotations

import asyncio
import socket

from gateway.serving.edge.listen import bind_listener as _bind
from tests.waiting import async_wait_until


def test_accepted_connections_have_nagle_off() -> None:
    listener = _bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    assert listener.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    async def scenario() -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await async_wait_until(lambda: seen, what="the connection to be accepted")
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
    assert seen and seen[0] != 0
