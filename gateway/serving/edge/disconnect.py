"""A client that hangs up cancels its request: queued, waiting for the engine, or reading its answer.

Starlette cancels nothing when the client of a plain (non-streaming) response leaves, so an abandoned
request would keep its engine slot and its generation until the answer is complete (minutes for a
request without max_tokens). This pure ASGI middleware listens for ``http.disconnect`` once the body
has been read and cancels the request's task; the upstream connection closes with it (the engine
stops generating) and the admission slot is released on the way out. Streams already stop on a
disconnect; they see it here too, through the same receive channel.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = asyncio.Event()
        after_body: asyncio.Queue[Message] = asyncio.Queue()

        async def app_receive() -> Message:
            if body_done.is_set():
                return await after_body.get()  # the watcher's disconnect, when it comes
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                body_done.set()
            return message

        handler = asyncio.current_task()
        assert handler is not None

        async def watch() -> None:
            await body_done.wait()
            message = await receive()
            await after_body.put(message)
            if message["type"] == "http.disconnect" and not responded.is_set():
                handler.cancel()

        responded = asyncio.Event()

        async def app_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                responded.set()
            await send(message)

        watcher = asyncio.create_task(watch(), name="disconnect watcher")
        try:
            await self.app(scope, app_receive, app_send)
        except asyncio.CancelledError:
            if not watcher.done() or responded.is_set():
                raise  # cancelled from outside (shutdown), not by the client leaving
            handler.uncancel()  # the client left: nothing to answer, nobody to answer to
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
