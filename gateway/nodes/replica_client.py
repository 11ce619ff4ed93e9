"""The head's side of a replica on another node: that node's worker, asked to run a whole engine server.

:class:`WorkerReplicas` is a replica's :class:`gateway.supervision.remote_run.ReplicaControl`: it finds the
node's worker by the name the last survey reported and asks it, with the worker key and an asyncio client,
to start the server (``POST /replica/start``), to keep it (``/replica/lease``, which also brings its log
lines) and to stop it (gateway/nodes/replica_servers.py is the worker's side).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx

from gateway.core.errors import GatewayError
from gateway.core.tls import async_http_client
from gateway.nodes.replica_servers import LINE_CHARS, LINES_PER_ANSWER
from gateway.nodes.start_request import FollowerState, ServerStart
from gateway.nodes.survey import Nodes
from gateway.nodes.worker_calls import WorkerAnswer, post_to_worker, worker_state
from gateway.supervision.remote_run import Lease, ReplicaRefused, ServerState, Started

CALL_TIMEOUT_S = 5.0  # a renewal is a few hundred bytes: a node that takes longer counts as a miss
START_TIMEOUT_S = 30.0  # a start first stops the replica's engine that runs (its grace: 10 s)
UNSPECIFIED = ("", "0.0.0.0", "::")  # a worker bound to every interface: reached where the head reaches it


class WorkerReplicas:
    """The whole servers one node's worker runs for this head."""

    def __init__(
        self,
        nodes: Nodes,
        node: str,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        client: Callable[[float], httpx.AsyncClient] | None = None,
    ) -> None:
        self.nodes = nodes
        self.node = node
        self.timeout_s = timeout_s
        self.client = client or (lambda timeout: async_http_client(timeout=timeout))

    async def _post(self, path: str, body: Mapping[str, Any], timeout_s: float | None = None) -> WorkerAnswer:
        try:
            return await post_to_worker(
                self.nodes, self.node, path, body, client=self.client, timeout_s=timeout_s or self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise GatewayError(f"worker {self.node} cannot be reached ({type(exc).__name__}: {exc})") from exc

    async def start(
        self, replica: str, engine: str, version: str, args: tuple[str, ...], env: Mapping[str, str], lease_s: float
    ) -> Started:
        request = ServerStart(replica, engine, version, args, dict(env), lease_s)
        answer = await self._post("/replica/start", request.to_json(), max(self.timeout_s, START_TIMEOUT_S))
        data = answer.data
        if answer.status != 200 or not isinstance(data, dict):
            raise ReplicaRefused(f"worker {self.node} refused replica {replica}: {answer.message()}")
        port, address = data.get("port"), data.get("address")
        if not isinstance(port, int) or not 0 < port < 65536 or not isinstance(address, str) or len(address) > 255:
            raise ReplicaRefused(f"worker {self.node} answered no port for replica {replica}: {answer.text[:200]}")
        if address in UNSPECIFIED:
            address = worker_state(self.nodes, self.node).address.rsplit(":", 1)[0].strip("[]")
        pid = data.get("pid")
        return Started(address, port, pid if isinstance(pid, int) else None)

    async def renew(self, replica: str, since: int) -> Lease:
        answer = await self._post("/replica/lease", {"replica": replica, "since": since})
        data = answer.data
        if answer.status != 200 or not isinstance(data, dict):
            raise GatewayError(f"worker {self.node} answered {answer.status} to /replica/lease")
        state = FollowerState.read(data.get("state"))
        lines = data.get("lines") or []
        after = data.get("next", since)
        code = data.get("code")
        reason = str(data.get("reason") or ("" if state is not FollowerState.NONE else "the worker runs none of it"))
        return Lease(
            ServerState.RUNNING
            if state is FollowerState.RUNNING
            else ServerState.EXITED
            if state is FollowerState.EXITED
            else ServerState.NONE,
            # as many lines, as long, as the worker sends at most
            tuple(str(line)[:LINE_CHARS] for line in lines[:LINES_PER_ANSWER]) if isinstance(lines, list) else (),
            after if isinstance(after, int) else since,
            code if isinstance(code, int) else None,
            reason[:LINE_CHARS],
        )

    async def stop(self, replica: str) -> None:
        await self._post("/replica/stop", {"replica": replica}, max(self.timeout_s, START_TIMEOUT_S))
