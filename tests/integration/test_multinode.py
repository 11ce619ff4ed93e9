"""Two machines, one model, for real: three network namespaces stand in for a head and two worker
nodes (each worker's only link is a veth pair to the head; every address lives inside the namespaces
made here). Each worker node runs `gateway worker` with a real ggml-rpc-server; the head runs
`gateway serve --workers …` whose real llama-server puts SmolLM2's layers on both workers. Then one
worker node loses every process (SIGKILL, as if unplugged): the head re-plans over what is left,
with more layers in its RAM, and serves again; the worker comes back and the next re-plan uses it.
Namespaces and processes are removed at the end, also when a test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gatewayproc import engine_threads
from tests.integration.netns import Inside, Namespaces, take_down, unavailable
from tests.integration.node_gateways import HEAD_PORT, NodeGateways
from tests.waiting import answers, exited, wait_until

pytestmark = pytest.mark.engine

KEY = "worker-key-for-tests"
MODEL = "smollm2-135m-instruct"
CONTEXT = 4096
# Sized so that both devices together hold every layer and one alone does not (see plan_for_test_sizes)
DEVICE = "1x1170MiB"
WORKER_PORT = 50100
RPC_PORT = 50052
NODES = {"a": ("10.231.1.1/24", "10.231.1.2"), "b": ("10.231.2.1/24", "10.231.2.2")}


@dataclass
class Cluster(NodeGateways):
    head_ns: str

    def chat(self, text: str = "What is the capital of France?", max_tokens: int = 12) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
        return self.inside.call(httpx.post, self.url + "/v1/chat/completions", json=body, timeout=120)

    def start_worker(self, node: str) -> None:
        address = NODES[node][1]
        self.start(
            f"worker-{node}", f"{self.nets.prefix}-{node}",
            "worker", "--host", address, "--port", str(WORKER_PORT), "--rpc-port", str(RPC_PORT),
            "--gpus", DEVICE, "--name", f"node-{node}", "--api-key", KEY, "--threads", "1",
            "--state-dir", str(self.workdir / f"state-{node}"),
        )  # fmt: skip
        self.wait(lambda: self.inside.call(answers, f"http://{address}:{WORKER_PORT}/health"), f"worker-{node}")

    def wait(self, ready: Any, name: str, timeout_s: float = 120) -> None:
        try:
            wait_until(
                ready, what=f"{name} to be ready", timeout_s=timeout_s, interval_s=0.2, abort=exited(self.procs[name])
            )
        except AssertionError as failed:
            raise AssertionError(f"{failed}:\n{self.log(name)[-4000:]}") from None

    def wait_serving(self, timeout_s: float = 120) -> None:
        self.wait(lambda: self.inside.call(answers, self.url + "/ready"), "head", timeout_s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Iterator[Cluster]:
    if why := unavailable():
        pytest.skip(f"cannot make network namespaces here: {why}")
    nets = Namespaces(f"gwt{os.getpid() % 100000}")
    inside: Inside | None = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        head_ns = nets.add("head")
        for node, (head_side, worker_side) in NODES.items():
            nets.add(node)
            nets.link(head_ns, head_side, f"{nets.prefix}-{node}", f"{worker_side}/24")
        inside = Inside(head_ns)
        cluster = Cluster(nets, inside, tmp_path_factory.mktemp("multinode"), head_ns)
        procs = cluster.procs
        for node in NODES:
            cluster.start_worker(node)
        workers = ",".join(f"{address}:{WORKER_PORT}" for _, address in NODES.values())
        cluster.start(
            "head", head_ns,
            "serve", "--port", str(HEAD_PORT), "--workers", workers, "--worker-api-key", KEY,
            "--context-length", str(CONTEXT), "--threads", str(engine_threads()),
            "--state-dir", str(cluster.workdir / "state-head"),
        )  # fmt: skip
        cluster.wait_serving()
        yield cluster
    finally:
        take_down(nets, procs, inside, grace_s=30)  # the head stops its engine, workers their servers


def _argv(status: dict[str, Any]) -> list[str]:
    return list(status["backend"]["argv"])


def _rpc(status: dict[str, Any]) -> str | None:
    """The engine's ``--rpc`` devices, None while no engine runs."""
    return _flag(_argv(status), "--rpc") if status.get("backend") else None


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_layers_are_placed_on_both_workers(cluster: Cluster) -> None:
    status = cluster.status()
    argv = _argv(status)
    assert _flag(argv, "--rpc") == f"{NODES['a'][1]}:{RPC_PORT},{NODES['b'][1]}:{RPC_PORT}"
    assert _flag(argv, "-ts") and len(_flag(argv, "-ts").split(",")) == 2  # type: ignore[union-attr]
    memory = status["backend"]["memory_mib"]
    for _, address in NODES.values():  # the engine's own buffer lines: weights and KV on each worker
        placed = memory[f"RPC[{address}:{RPC_PORT}]"]
        assert placed["model"] > 10 and placed["kv_cache"] > 1
    nodes = {node["name"]: node for node in status["nodes"]}
    assert nodes["node-a"]["state"] == nodes["node-b"]["state"] == "in use"
    assert nodes["node-a"]["devices"][0]["placed_mib"]["model"] > 10
    assert "slowest link" in status["plan"]["decision"]


def test_chat_through_the_gateway_runs_across_the_nodes(cluster: Cluster) -> None:
    reply = cluster.chat()
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == MODEL and body["choices"][0]["message"]["content"]


def test_a_worker_answers_only_with_the_key_and_its_servers_only_on_the_given_address(cluster: Cluster) -> None:
    url = f"http://{NODES['a'][1]}:{WORKER_PORT}/inventory"
    assert cluster.inside.call(httpx.get, url, timeout=5).status_code == 401
    inventory = cluster.inside.call(httpx.get, url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5).json()
    assert inventory["node"] == "node-a" and inventory["devices"][0]["endpoint"] == f"{NODES['a'][1]}:{RPC_PORT}"
    assert inventory["devices"][0]["total_bytes"] == 1170 * 2**20 and inventory["build"]
    listening = subprocess.run(
        ["ip", "netns", "exec", f"{cluster.nets.prefix}-a", "ss", "-ltnH"], capture_output=True, text=True, check=True
    ).stdout
    assert f"{NODES['a'][1]}:{RPC_PORT}" in listening and f"0.0.0.0:{RPC_PORT}" not in listening


def test_a_lost_worker_is_planned_around_and_a_returning_one_used_again(cluster: Cluster) -> None:
    before = _argv(cluster.status())
    cluster.nets.kill_all(f"{cluster.nets.prefix}-b")  # node b is gone: worker and ggml-rpc-server
    cluster.chat()  # the engine notices on its next use of the device (this request may fail with 503)
    status = cluster.status_when(
        lambda status: status["state"] == "ready" and _rpc(status) == f"{NODES['a'][1]}:{RPC_PORT}",
        "a re-plan without node b",
    )
    reply = cluster.chat()
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text
    after = _argv(status)
    assert int(_flag(after, "-ngl") or 0) < int(_flag(before, "-ngl") or 0)  # more layers in the head's RAM
    nodes = {node["name"]: node for node in status["nodes"]}
    assert nodes["node-b"]["state"] == "lost" and nodes["node-b"]["lost"] == 1
    assert status["replans"] and "cannot be reached" in status["replans"][0]["why"]
    metrics = cluster.get("/metrics").text
    assert 'gateway_node_lost{node="node-b"} 1.0' in metrics and 'gateway_node_up{node="node-a"} 1.0' in metrics

    # node b comes back; the next re-plan (here: after the engine dies) uses it again
    cluster.start_worker("b")
    engine = int(status["backend"]["pid"])
    os.kill(engine, signal.SIGKILL)
    cluster.status_when(
        lambda status: status["state"] == "ready" and NODES["b"][1] in (_rpc(status) or ""), "node b used again"
    )
    assert cluster.chat().status_code == 200


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_workers_servers_do_not_outlive_it(tmp_path: Path, stop: signal.Signals) -> None:
    """Stopped in order or killed outright: its ggml-rpc-servers go with it (no namespace needed)."""
    import psutil

    from tests.integration.gatewayproc import free_port

    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "worker", "--port", str(port), "--rpc-port", str(free_port()),
        "--gpus", "1x1GiB,1x1GiB", "--api-key", KEY, "--threads", "1", "--state-dir", str(tmp_path),
    ]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: answers(f"http://127.0.0.1:{port}/health"),
            what="the worker's /health",
            timeout_s=60,
            interval_s=0.1,
            abort=exited(worker, (tmp_path / "worker.log").read_text),
        )
        inventory = httpx.get(f"http://127.0.0.1:{port}/inventory", headers={"x-api-key": KEY}, timeout=5).json()
        assert [d["running"] for d in inventory["devices"]] == [True, True]
        servers = [p for p in psutil.Process(worker.pid).children(recursive=True) if "ggml-rpc" in p.name()]
        assert len(servers) == 2
        worker.send_signal(stop)
        worker.wait(timeout=30)
        _, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive, f"left behind after {stop.name}: {alive}"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_an_unplugged_worker_is_noticed_without_a_request_and_planned_around(cluster: Cluster) -> None:
    """No process dies and no reset comes back: the node watch (every 5 s, two misses) stops the engine
    that would wait on the device, and the re-plan leaves the node out."""
    assert _flag(_argv(cluster.status()), "--rpc") == f"{NODES['a'][1]}:{RPC_PORT},{NODES['b'][1]}:{RPC_PORT}"
    cluster.nets.unplug(f"{cluster.nets.prefix}-a")
    status = cluster.status_when(
        lambda status: status["state"] == "ready" and _rpc(status) == f"{NODES['b'][1]}:{RPC_PORT}",
        "node a left out",
    )
    assert {n["name"]: n["state"] for n in status["nodes"]}["node-a"] == "lost"
    assert cluster.chat().status_code == 200
