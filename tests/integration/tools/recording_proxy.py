"""A recording pass-through between a real coding agent and the gateway: what each agent really sends.

    python recording_proxy.py PORT TARGET_URL OUT_DIR

Every request is forwarded to TARGET_URL unchanged (bodies and streams byte for byte) and written to
OUT_DIR as ``NN-<route>.json`` in arrival order: method, path, query, the headers minus credentials and
hop-by-hop ones, the JSON body, and the status the gateway answered (with its body when it was an
error). A streamed answer is relayed untouched; when it ends, the record gains how it finished, as each
dialect says it (``stream_finish``: a stop, or the output limit). tests/data/agent-requests/ keeps such
recordings as fixtures; tests/integration/test_agents_real.py reads them to see what the agent got.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# credentials never reach a fixture; the rest are per-connection and say nothing about the agent
DROPPED = {"authorization", "x-api-key", "cookie", "host", "content-length", "connection", "transfer-encoding"}
HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}
ERROR_BODY_LIMIT = 4096
# how a stream says it finished: a Responses event, a chat chunk's finish reason, a Messages stop reason
FINISH = re.compile(rb'event: ?(response\.(?:completed|incomplete|failed))|"(?:finish|stop)_reason": ?"(\w+)"')
FINISH_OVERLAP = 256  # bytes kept from the previous chunk, so a marker split across two is still seen

_lock = threading.Lock()


def slug(path: str) -> str:
    """``/v1/chat/completions`` -> ``v1-chat-completions``; ``/`` -> ``root``."""
    return path.strip("/").replace("/", "-") or "root"


def auth_scheme(headers: dict[str, str]) -> str | None:
    """Which credential the agent sent (never the value): replay needs the same scheme."""
    if "x-api-key" in headers:
        return "x-api-key"
    value = headers.get("authorization", "")
    return value.split(" ", 1)[0].lower() if value else None


def _write(out_dir: Path, record: dict[str, Any]) -> Path:
    with _lock:  # numbered on from what the folder holds, so one folder can take several runs
        number = len(list(out_dir.glob("*.json"))) + 1
        path = out_dir / f"{number:02d}-{slug(record['path'])}.json"
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def make_app(target: str, out_dir: Path) -> Starlette:
    client = httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(600, connect=10), trust_env=False)

    async def forward(request: Request) -> Response:
        raw = await request.body()
        lowered = {k.lower(): v for k, v in request.headers.items()}
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"_not_json": raw.decode(errors="replace")[:ERROR_BODY_LIMIT]}
        record: dict[str, Any] = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "auth": auth_scheme(lowered),
            "headers": {k: v for k, v in sorted(lowered.items()) if k not in DROPPED},
            "body": body,
        }
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}]
        upstream = await client.send(
            client.build_request(request.method, request.url.path, params=request.url.query or None,
                                 headers=headers, content=raw),
            stream=True,
        )  # fmt: skip
        record["status"] = upstream.status_code
        answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        if upstream.status_code >= 400:
            content = await upstream.aread()
            await upstream.aclose()
            record["error"] = content.decode(errors="replace")[:ERROR_BODY_LIMIT]
            _write(out_dir, record)
            answer_headers.pop("content-encoding", None)
            return Response(upstream.content, upstream.status_code, answer_headers)
        path = _write(out_dir, record)

        async def relay() -> AsyncIterator[bytes]:
            carry, finishes = b"", set[str]()
            try:
                async for chunk in upstream.aiter_raw():
                    window = carry + chunk
                    finishes.update((m[1] or m[2]).decode() for m in FINISH.finditer(window))
                    carry = window[-FINISH_OVERLAP:]
                    yield chunk
            finally:
                record["stream_finish"] = sorted(finishes)
                path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")

        closing = BackgroundTask(upstream.aclose)
        return StreamingResponse(relay(), upstream.status_code, answer_headers, background=closing)

    methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


if __name__ == "__main__":
    port, target, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    uvicorn.run(make_app(target, out), host="127.0.0.1", port=port, log_level="warning")
