"""Processes the proxy benchmark runs: a fast fake upstream and two thin reference passthroughs.

    python servers.py upstream PORT CHUNKS DELAY_MS
    python servers.py httpx-proxy PORT UPSTREAM_URL
    python servers.py aiohttp-proxy PORT UPSTREAM_URL

The upstream answers non-streaming requests at once and streams CHUNKS chunks DELAY_MS apart, each at
its own time from the stream's start (an engine's token pace is set by its accelerator: it does not
drift when a proxy on the same two cores takes CPU, which sleeping DELAY_MS after each write did). The
references are the ~40-line passthroughs a Python gateway cannot beat (starlette + httpx, starlette +
aiohttp's client): the floor the gateway is measured against in the same run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


def upstream(port: int, chunks: int, delay_ms: float) -> None:
    from aiohttp import web

    answer = json.dumps(ANSWER).encode()

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "bench", "object": "model", "max_model_len": 32768}]}
        )

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index in range(chunks):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench"}
            chunk["choices"] = [{"index": 0, "delta": {"content": f"{index} {time.time():.6f}"}, "finish_reason": None}]
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(max(0.0, start + (index + 1) * delay_ms / 1000 - loop.time()))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def httpx_proxy(port: int, target: str) -> None:
    import httpx

    client = httpx.AsyncClient(base_url=target, timeout=None, limits=httpx.Limits(max_connections=None))

    async def forward(request: Request) -> Response:
        upstream_request = client.build_request(
            request.method, request.url.path, content=await request.body(), headers={"content-type": "application/json"}
        )
        upstream = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            headers={"content-type": upstream.headers["content-type"]},
            background=BackgroundTask(upstream.aclose),
        )

    app = Starlette(routes=[Route("/v1/{path:path}", forward, methods=["GET", "POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def aiohttp_proxy(port: int, target: str) -> None:
    import aiohttp

    session: dict[str, aiohttp.ClientSession] = {}

    async def forward(request: Request) -> Response:
        if "s" not in session:
            session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        upstream = await session["s"].request(
            request.method,
            target + request.url.path,
            data=await request.body(),
            headers={"content-type": "application/json"},
        )

        async def body() -> AsyncIterator[bytes]:
            async for chunk in upstream.content.iter_any():
                yield chunk

        return StreamingResponse(
            body(),
            status_code=upstream.status,
            headers={"content-type": upstream.headers["content-type"]},
            background=BackgroundTask(upstream.release),
        )

    app = Starlette(routes=[Route("/v1/{path:path}", forward, methods=["GET", "POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "upstream":
        upstream(port, int(sys.argv[3]), float(sys.argv[4]))
    elif kind == "httpx-proxy":
        httpx_proxy(port, sys.argv[3])
    else:
        aiohttp_proxy(port, sys.argv[3])
