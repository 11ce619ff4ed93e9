"""The head's side of an engine group: the ranks on other nodes, through each node's ``gateway worker``.

:class:`WorkerGroup` is the supervisor's ``GroupControl`` (gateway/supervision/group.py): it finds each
rank's worker by the node name the last survey reported, and asks it, with the worker key, to start
the rank (the worker's own engine, the head's arguments), to keep it (the lease), and to stop it.
Each call is awaited on the head's event loop, within ``2 * timeout_s`` in all (httpx's timeout is per
connect and per read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.backends.base import Follower
from gateway.core.errors import GatewayError
from gateway.core.tls import async_http_client
from gateway.nodes.start_request import FollowerState, StartRequest
from gateway.nodes.survey import Nodes
from gateway.nodes.worker_calls import WorkerAnswer, post_to_worker, worker_state
from gateway.supervision.group import RankRefused

CALL_TIMEOUT_S = 10.0


class WorkerGroup:
    """Starts, keeps and stops a group's ranks on the workers that ``nodes`` surveyed."""

    def __init__(
        self,
        nodes: Nodes,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        client: Callable[[float], httpx.AsyncClient] | None = None,
    ) -> None:
        self.nodes = nodes
        self.timeout_s = timeout_s
        self.client = client or (lambda timeout: async_http_client(timeout=timeout))

    async def _post(self, node: str, path: str, body: dict[str, Any] | None = None) -> WorkerAnswer:
        """One call to the node's worker; raises httpx.TimeoutException past ``2 * timeout_s`` in all."""
        return await post_to_worker(self.nodes, node, path, body or {}, client=self.client, timeout_s=self.timeout_s)

    async def start(self, follower: Follower, lease_s: float) -> None:
        """Ask the node's worker to start the rank; raises RankRefused with the worker's words, or
        GatewayError when it cannot be reached."""
        report = worker_state(self.nodes, follower.node).report
        host_ip = report.peer_address if report is not None else ""
        request = StartRequest(follower.engine, follower.version, follower.rank, follower.args, host_ip, lease_s)
        try:
            answer = await self._post(follower.node, "/group/start", request.to_json())
        except httpx.HTTPError as exc:
            raise GatewayError(f"worker {follower.node} cannot be reached ({type(exc).__name__}: {exc})") from exc
        if answer.status == 200:
            return
        raise RankRefused(f"worker {follower.node} refused rank {follower.rank}: {answer.message()}")

    async def renew(self, node: str) -> str | None:
        """Renew the rank's lease: None while it runs; why not, when it exited or has none (its worker
        answered). Raises GatewayError when the worker does not answer (the caller counts the misses)."""
        try:
            answer = await self._post(node, "/group/lease")
        except httpx.HTTPError as exc:
            raise GatewayError(f"worker {node} does not answer ({type(exc).__name__})") from exc
        data = answer.data if answer.status == 200 else None
        if not isinstance(data, dict):
            raise GatewayError(f"worker {node} answered {answer.status} to /group/lease")
        if FollowerState.read(data.get("state")) is FollowerState.RUNNING:
            return None
        why = str(data.get("reason") or "it has no rank running")
        lines = data.get("last_lines") or []
        return f"the rank on {node} {why}" + (f": {' | '.join(map(str, lines[-3:]))}" if lines else "")

    async def stop(self, node: str) -> None:
        """Ask the node's worker to stop the rank; a worker that does not answer is left to its lease."""
        try:
            await self._post(node, "/group/stop")
        except (httpx.HTTPError, GatewayError):
            return
