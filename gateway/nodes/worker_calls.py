"""One call from the head to a node's worker, as a group's ranks (gateway/nodes/group.py) and the replicas
on other nodes (gateway/nodes/replica_client.py) make it: the worker found by the node name the last
survey reported, the worker key sent, the answer read within :data:`MAX_ANSWER_BYTES` (decoded: the cap
holds for a compressed one too) and the whole call within ``2 * timeout_s`` (httpx's timeout is per
connect and per read: a worker sending a byte at a time would otherwise hold the caller's watch).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.core.auth import bearer_header
from gateway.core.errors import GatewayError
from gateway.nodes.survey import Nodes, NodeState

# a worker's answer is read up to this: the largest, a replica's lease, is at most 200 lines of 2,000
# characters (gateway/nodes/replica_servers.py), about 400 kB
MAX_ANSWER_BYTES = 1 << 20

ClientFactory = Callable[[float], httpx.AsyncClient]


@dataclass(frozen=True)
class WorkerAnswer:
    """A worker's answer: its status, its JSON (None: not JSON, or nested past the parser's depth), its text."""

    status: int
    data: Any
    text: str

    def message(self) -> str:
        """The worker's own words for a refusal (its error's message), else the start of its answer."""
        try:
            return str(self.data["error"]["message"])[:2000]
        except (KeyError, TypeError):
            return self.text[:300]


def worker_state(nodes: Nodes, node: str) -> NodeState:
    """The surveyed worker of ``node``; GatewayError when the last survey reported none by that name."""
    for state in nodes.states:
        if state.report is not None and state.report.name == node:
            return state
    raise GatewayError(f"no worker reported node {node!r} at the last survey")


async def post_to_worker(
    nodes: Nodes, node: str, path: str, body: Mapping[str, Any], *, client: ClientFactory, timeout_s: float
) -> WorkerAnswer:
    """POST ``body`` to ``node``'s worker. Raises httpx.HTTPError when it cannot be reached or holds the call
    past ``2 * timeout_s`` (a TimeoutException), GatewayError when no survey reported the node or its answer
    is over :data:`MAX_ANSWER_BYTES`."""
    state = worker_state(nodes, node)
    url, headers = f"http://{state.address}{path}", bearer_header(nodes.api_key)
    try:
        status, raw = await asyncio.wait_for(_read(client(timeout_s), url, body, headers, node, path), 2 * timeout_s)
    except TimeoutError as exc:
        raise httpx.TimeoutException(f"no answer within {2 * timeout_s:g} s") from exc
    text = raw.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    return WorkerAnswer(status, data, text)


async def _read(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: dict[str, str], node: str, path: str
) -> tuple[int, bytes]:
    raw = bytearray()
    async with client, client.stream("POST", url, json=dict(body), headers=headers) as answer:
        async for part in answer.aiter_bytes():
            raw += part
            if len(raw) > MAX_ANSWER_BYTES:
                raise GatewayError(f"worker {node} answered {path} with over {MAX_ANSWER_BYTES} bytes")
        return answer.status_code, bytes(raw)
