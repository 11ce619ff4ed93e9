"""vLLM across nodes as one group (issue 40), without the engine: the plan that serve can start (every
node's worker runs the head's vLLM), the exact commands of every rank, the worker's side (start,
refusal naming both versions, lease, stop) with a stand-in follower process, and one fate for the group
(any rank's exit, a silent worker, a failed canary stop every rank; the supervisor re-plans) with a
stand-in rank 0 and worker control. The real thing over two namespace nodes:
tests/integration/test_vllm_multinode.py."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import ANY

import pytest
from starlette.testclient import TestClient

from gateway.backends import vllm
from gateway.backends.base import Follower, Installation
from gateway.backends.vllm import multinode
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.follower import HOST
from gateway.backends.vllm.group import GroupPlan
from gateway.backends.vllm.memory import Checkpoint
from gateway.core.devices import GIB, Device, Inventory, Peer
from gateway.core.errors import GatewayError
from gateway.core.policy import Policy
from gateway.nodes.followers import Followers, Hosted
from gateway.nodes.group import WorkerGroup
from gateway.nodes.start_request import Refused, StartRequest
from gateway.nodes.survey import report_from
from gateway.nodes.worker import Worker, WorkerConfig, create_app
from gateway.supervision.engine_run import RunState
from gateway.supervision.group import RANK_LOST, GroupRun, RankRefused
from gateway.supervision.lifecycle import State
from tests.unit.http_harness import Served
from tests.unit.test_multinode import answering
from tests.unit.test_replica_on_node import _lease_checks
from tests.unit.test_supervisor_transitions import TIMEOUT_S, Engines, ReplayRun, _supervisor, _until, serves
from tests.waiting import async_wait_until

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
VERSION = "0.32.0+cpu"


def _checkpoint() -> Checkpoint:
    facts = checkpoint_facts(json.loads((CONFIGS / "Qwen2.5-3B.json").read_text()), "Qwen2.5-3B")
    return Checkpoint(facts.name, facts)


def _machine(*peers: Peer) -> Inventory:
    lent = tuple(Device(0, "CPU", 16 * GIB, 16 * GIB, (0, 0), kind="cpu", node=p.node, endpoint="x:1") for p in peers)
    return Inventory((), 16 * GIB, 16 * GIB, source="none", remote=lent, peers=peers)


def _peer(node: str = "node-b", version: str = VERSION) -> Peer:
    return Peer(node, {"vllm": version}, "10.0.0.2", "10.0.0.1", "eth1")


# -- the plan ------------------------------------------------------------------------------------------


def test_a_cpu_group_over_nodes_that_run_the_heads_vllm_is_startable_and_never_eager() -> None:
    (found,) = multinode.cpu_candidates(_checkpoint(), _machine(_peer()), VERSION, Policy(), 2, served_name="m")
    assert found.group == GroupPlan(("node-b",), "10.0.0.1", "eth1") and found.pipeline_parallel_size == 2
    assert not found.flags.enforce_eager  # eager breaks PP on CPU (tests/data/vllm_cpu_multinode.txt)
    assert found.fits and vllm.BACKEND.ranked([found]) == [found]
    assert multinode.STARTED in found.reason


def test_a_node_with_another_vllm_runs_no_rank_and_the_plan_says_both_versions() -> None:
    machine = _machine(_peer(version="0.31.0"))
    assert multinode.cpu_candidates(_checkpoint(), machine, VERSION, Policy(), 2, served_name="m") == []
    ready, notes = multinode.hosting(machine, VERSION)
    assert ready == [] and notes == [
        f"vLLM across nodes: node-b has vLLM 0.31.0, this machine {VERSION}: it runs no rank"
    ]


def test_a_gpu_group_is_planned_only_until_every_node_reports_the_heads_vllm() -> None:
    gpus = tuple(Device(i, "RTX", 24 * GIB, 24 * GIB, (8, 9), node="n2", endpoint="n2:1") for i in range(2))
    machine = Inventory(gpus[:0] + tuple(replace(g, node="") for g in gpus), 64 * GIB, 64 * GIB, remote=gpus)
    assert multinode.group_plan(machine, ["n2"], "0.32.0") is None
    peered = replace(machine, peers=(Peer("n2", {"vllm": "0.32.0"}, "10.0.0.2", "10.0.0.1", "eth1"),))
    assert multinode.group_plan(peered, ["n2"], "0.32.0") == GroupPlan(("n2",), "10.0.0.1", "eth1")


def test_rank_0_and_the_followers_get_the_same_engine_arguments_and_their_group_flags() -> None:
    (found,) = multinode.cpu_candidates(_checkpoint(), _machine(_peer()), VERSION, Policy(), 2, served_name="m")
    command = ("/venv/bin/python", "-m", multinode.API_SERVER_MODULE)
    option = vllm.VllmOption(
        "Qwen2.5-3B", found.flags, "m", command, version=VERSION, on_cpu=True, group=found.group,
        pipeline_parallel_size=2,
    )  # fmt: skip
    launch = option.launch(8123, "k")
    argv = launch.argv
    master = argv[argv.index("--master-port") + 1]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1" and "--headless" not in argv
    assert launch.env["VLLM_HOST_IP"] == "10.0.0.1" and launch.env["GLOO_SOCKET_IFNAME"] == "eth1"
    (follower,) = launch.followers
    assert (follower.node, follower.rank, follower.engine, follower.version) == ("node-b", 1, "vllm", VERSION)
    args = list(follower.args)
    assert args[:2] == ["--model", "Qwen2.5-3B"] and args[-1] == "--headless"
    assert args[args.index("--node-rank") + 1] == "1" and args[args.index("--master-port") + 1] == master
    engine = argv[3:argv.index("--nnodes")]  # fmt: skip
    assert [a for a in args if a not in ("--headless",)][: len(engine)] == engine  # the head's exact arguments
    # the worker runs them with its own vLLM; through the api_server module, vLLM's headless entry
    assert HOST.argv(command, args)[:3] == ["/venv/bin/python", "-c", multinode.HEADLESS_ENTRY]
    assert HOST.argv(("vllm", "serve"), args) == ["vllm", "serve", *args]
    assert HOST.env("10.0.0.2", "eth0")["GLOO_SOCKET_IFNAME"] == "eth0"


def test_a_workers_inventory_says_which_engines_run_ranks_there() -> None:
    answer = {
        "node": "b", "group_engines": {"vllm": {"version": VERSION}, "bad": 3},
        "devices": [{"index": 0, "name": "CPU", "total_bytes": GIB, "free_bytes": GIB, "compute_capability": "0.0",
                     "endpoint": "b:50052", "kind": "cpu"}],
    }  # fmt: skip
    report = report_from("b:50100", answer, 0.2)
    assert report.engines == {"vllm": VERSION} and report.peer() is None  # no address towards it yet
    peer = replace(report, peer_address="10.0.0.2", head_address="10.0.0.1", head_interface="eth1").peer()
    assert peer == Peer("b", {"vllm": VERSION}, "10.0.0.2", "10.0.0.1", "eth1")


# -- the worker's side ----------------------------------------------------------------------------------


class FakeHost:
    """A follower that is a Python sleeping (or exiting at once): what no real engine does on cue."""

    engine = "vllm"
    title = "vLLM"
    inherit: tuple[str, ...] = ()

    def argv(self, command: Any, args: Any) -> list[str]:
        return [*command, *args]

    def env(self, host_ip: str, interface: str) -> dict[str, str]:
        return {"VLLM_HOST_IP": host_ip, "GLOO_SOCKET_IFNAME": interface}


SLEEPER = (sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))")  # a rank that lives argv[1] s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _followers(tmp_path: Path, version: str = VERSION) -> tuple[Followers, Clock]:
    clock = Clock()
    hosted = {"vllm": Hosted(FakeHost(), Installation(SLEEPER, version, "installed", "cpu"))}
    return Followers(hosted, tmp_path, clock=clock, interface=lambda ip: "eth9" if ip == "10.0.0.2" else None), clock


def _request(**changes: Any) -> StartRequest:
    return replace(StartRequest("vllm", VERSION, 1, ("60",), "10.0.0.2", 20.0), **changes)


def test_a_worker_refuses_a_rank_of_another_version_naming_both(tmp_path: Path) -> None:
    async def scenario() -> None:
        followers, _ = _followers(tmp_path, version="0.31.0+cpu")
        with pytest.raises(Refused, match=r"this node has vLLM 0\.31\.0\+cpu, the head 0\.32\.0\+cpu") as refused:
            await followers.start(_request())
        assert refused.value.status == 409 and followers.state()["state"] == "none"

    asyncio.run(scenario())


def test_a_rank_runs_until_the_head_stops_it_or_its_lease_runs_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        followers, clock = _followers(tmp_path)
        with pytest.raises(Refused, match="not an address of this node"):
            await followers.start(_request(host_ip="10.9.9.9"))
        state = await followers.start(_request())
        assert state["state"] == "running" and state["rank"] == 1 and state["lease_left_s"] == 20.0
        assert followers.child is not None and followers.child.env["GLOO_SOCKET_IFNAME"] == "eth9"
        clock.now += 15
        assert followers.renew()["lease_left_s"] == 20.0  # renewed from now
        stopped = await followers.stop()
        assert stopped["state"] == "exited" and stopped["reason"] == "stopped by the head"

        await followers.start(_request())
        clock.now += 21  # no renewal: the head is gone
        watch = asyncio.create_task(followers.keep_lease(every_s=0.01))
        await async_wait_until(lambda: not followers.running, what="the lease to lapse", timeout_s=TIMEOUT_S * 5)
        watch.cancel()
        assert followers.state()["reason"] == "the head renewed no lease: it is gone"

    asyncio.run(scenario())


def test_the_time_a_worker_did_not_run_does_not_count_against_its_ranks_lease(tmp_path: Path) -> None:
    """As for a replica (test_replica_on_node): a check that woke 25 s late adds that time to the lease."""

    async def scenario() -> None:
        followers, clock = _followers(tmp_path)
        await followers.start(_request())  # a 20-s lease
        sleep, parked = _lease_checks(clock, [1.0, 26.0])
        watch = asyncio.create_task(followers.keep_lease(every_s=1.0, sleep=sleep))
        await asyncio.wait_for(parked.wait(), TIMEOUT_S)
        watch.cancel()
        assert followers.running and followers.state()["lease_left_s"] == 18.0

    asyncio.run(scenario())


def test_a_rank_that_exits_by_itself_is_reported_with_its_status(tmp_path: Path) -> None:
    async def scenario() -> None:
        followers, _ = _followers(tmp_path)
        await followers.start(_request(args=("not-a-number",)))
        await async_wait_until(lambda: not followers.running, what="the rank to exit", timeout_s=TIMEOUT_S * 5)
        state = followers.renew()
        assert state["state"] == "exited" and state["code"] == 1 and "exited with status 1" in state["reason"]

    asyncio.run(scenario())


def test_the_workers_group_routes_need_the_key_and_check_the_request(tmp_path: Path) -> None:
    machine = Inventory((), 8 * GIB, 8 * GIB, source="none")
    hosted = {"vllm": Hosted(FakeHost(), Installation(SLEEPER, VERSION, "installed", "cpu"))}
    worker = Worker(WorkerConfig(log_dir=tmp_path, cpu_memory="1GiB"), machine, ["rpc"], hosted)
    key = {"Authorization": "Bearer k"}
    with TestClient(create_app(worker, ("k",))) as client:
        assert client.post("/group/start", json={}).status_code == 401
        assert client.get("/inventory", headers=key).json()["group_engines"] == {"vllm": {"version": VERSION}}
        bad = client.post("/group/start", json={"engine": "vllm", "rank": 0}, headers=key)
        assert bad.status_code == 400 and "args" in bad.json()["error"]["message"]
        body = {"engine": "vllm", "version": "0.30.0", "rank": 1, "args": ["60"], "host_ip": "127.0.0.1", "lease_s": 5}
        refused = client.post("/group/start", json=body, headers=key)
        assert refused.status_code == 409 and "the head 0.30.0" in refused.json()["error"]["message"]
        started = client.post("/group/start", json=body | {"version": VERSION}, headers=key)
        assert started.status_code == 200 and started.json()["state"] == "running", started.text
        assert client.post("/group/lease", headers=key).json()["state"] == "running"
        assert client.post("/group/stop", headers=key).json()["state"] == "exited"
        assert client.get("/group", headers=key).json()["reason"] == "stopped by the head"


GOOD_START = StartRequest("vllm", VERSION, 1, ("60",), "127.0.0.1", 20.0).to_json()
HUGE_INPUTS = {  # (the start request's body, status, what the message says)
    "a rank of 300 digits": (json.dumps(GOOD_START | {"rank": 10**300}), 400, "rank"),
    "an argument of 100 kB": (json.dumps(GOOD_START | {"args": ["x" * 100_000]}), 400, "each argument"),
    "5000 arguments": (json.dumps(GOOD_START | {"args": ["x"] * 5000}), 400, "at most 1024 arguments"),
    "an engine name of 10 kB": (json.dumps(GOOD_START | {"engine": "v" * 10_000}), 400, "engine"),
    "an argument of 10 MB": (json.dumps(GOOD_START | {"args": ["x" * 10_000_000]}), 413, "at most 1048576 bytes"),
    "args nested 1000 deep": (
        json.dumps(GOOD_START).replace('["60"]', "[" * 1000 + "]" * 1000),
        400,
        "nested too deeply",
    ),
}


@pytest.mark.parametrize(("body", "status", "said"), HUGE_INPUTS.values(), ids=HUGE_INPUTS.keys())
def test_a_start_refused_for_its_size_is_a_400_and_the_running_rank_keeps_running(
    tmp_path: Path, body: str, status: int, said: str
) -> None:
    """A rank of 300 digits (a log name the file system refuses), a 10 MB argument (an execve the kernel
    refuses) or deep nesting (the parser's recursion) were each a 500, after the running rank was stopped."""
    machine = Inventory((), 8 * GIB, 8 * GIB, source="none")
    hosted = {"vllm": Hosted(FakeHost(), Installation(SLEEPER, VERSION, "installed", "cpu"))}
    worker = Worker(WorkerConfig(log_dir=tmp_path, cpu_memory="1GiB"), machine, ["rpc"], hosted)
    key = {"Authorization": "Bearer k"}
    with TestClient(create_app(worker, ("k",))) as client:
        running = client.post("/group/start", json=GOOD_START, headers=key).json()
        assert running["state"] == "running", running
        refused = client.post("/group/start", content=body, headers=key | {"Content-Type": "application/json"})
        assert refused.status_code == status and said in refused.json()["error"]["message"], refused.text[:300]
        assert client.get("/group", headers=key).json() == {**running, "lease_left_s": ANY}  # the same pid, running
        client.post("/group/stop", headers=key)


def test_a_start_body_past_its_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    machine = Inventory((), 8 * GIB, 8 * GIB, source="none")
    worker = Worker(WorkerConfig(log_dir=tmp_path, cpu_memory="1GiB"), machine, ["rpc"], {})
    declared = {"Authorization": "Bearer k", "Content-Length": str(300 * 1024 * 1024)}
    with TestClient(create_app(worker, ("k",))) as client:
        answer = client.post("/group/start", content=b"{}", headers=declared)  # 300 MB said, never sent
        chunked = client.post(
            "/group/start", content=iter([b"[" + b" " * 65536] * 40), headers={"Authorization": "Bearer k"}
        )  # no length said: cut at the cap while it arrives
    assert answer.status_code == 413 and "at most 1048576 bytes" in answer.json()["error"]["message"]
    assert chunked.status_code == 413


# -- one group, one fate ----------------------------------------------------------------------------------


class Control:
    """The workers as the group sees them: scripted renewals, every call recorded."""

    def __init__(self, renewals: list[str | Exception | None] | None = None, refuse: str | None = None) -> None:
        self.renewals = list(renewals or [])
        self.refuse = refuse
        self.calls: list[tuple[str, str]] = []

    async def start(self, follower: Follower, lease_s: float) -> None:
        self.calls.append(("start", follower.node))
        if self.refuse:
            raise RankRefused(self.refuse)

    async def renew(self, node: str) -> str | None:
        self.calls.append(("renew", node))
        answer = self.renewals.pop(0) if self.renewals else None
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def stop(self, node: str) -> None:
        self.calls.append(("stop", node))


FOLLOWER = Follower("node-b", 1, "vllm", VERSION, ("--model", "m", "--headless"))


def _group(
    control: Control, tmp_path: Path, canary: str | None = None, rank0_dies: bool = False
) -> tuple[GroupRun, ReplayRun]:
    option = vllm.VllmOption("m", vllm.VllmFlags(1, 0.9, 2048, 4, 2048), "m", ("vllm", "serve"))
    launch = replace(option.launch(1, "k"), followers=(FOLLOWER,))
    script = serves() if not rank0_dies else replace(serves(), dies=True)
    inner = ReplayRun(launch, option.classify, tmp_path, script)

    async def answer(_launch: Any) -> str | None:
        return canary

    async def tick(_seconds: float) -> None:
        await asyncio.sleep(0)

    return GroupRun(inner, control, canary=answer, sleep=tick), inner


def test_the_group_is_ready_only_after_the_followers_start_and_a_token_comes_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        control = Control()
        group, inner = _group(control, tmp_path)
        await group.start()
        assert await group.wait_settled() is RunState.READY and control.calls[0] == ("start", "node-b")
        ranks = group.snapshot()["group"]["ranks"]
        assert [(r["rank"], r["node"], r["state"]) for r in ranks] == [
            (0, "head (this machine)", "serving"), (1, "node-b", "serving")
        ]  # fmt: skip
        await group.stop()
        assert inner.stopped and ("stop", "node-b") in control.calls

        control = Control()
        failing, inner = _group(control, tmp_path, canary="the one-token canary was answered 500: boom")
        await failing.start()
        assert await failing.wait_settled() is RunState.FAILED
        assert inner.stopped and ("stop", "node-b") in control.calls and "500" in (failing.reason or "")

    asyncio.run(scenario())


def test_a_refused_rank_fails_the_start_with_the_workers_words_and_stops_rank_0(tmp_path: Path) -> None:
    async def scenario() -> None:
        words = "worker node-b refused rank 1: this node has vLLM 0.31.0, the head 0.32.0+cpu: install the same"
        group, inner = _group(Control(refuse=words), tmp_path)
        await group.start()
        assert await group.wait_settled() is RunState.FAILED and inner.stopped
        assert (
            group.failure is not None and group.failure.kind.name == "ENGINE_FAILED" and "0.31.0" in group.failure.line
        )

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("renewals", "why"),
    [
        ([None, GatewayError("no answer"), GatewayError("no answer"), GatewayError("no answer")], "stopped answering"),
        ([None, "the rank on node-b exited with status 1: RuntimeError: gloo"], "exited with status 1"),
    ],
    ids=["worker silent", "rank exited"],
)
def test_a_rank_gone_on_another_node_stops_every_rank(tmp_path: Path, renewals: list[Any], why: str) -> None:
    async def scenario() -> None:
        control = Control(renewals)
        group, inner = _group(control, tmp_path)
        await group.start()
        assert await group.wait_settled() is RunState.READY
        assert await asyncio.wait_for(group.wait_exit(), TIMEOUT_S) == RANK_LOST
        assert inner.stopped and control.calls[-1] == ("stop", "node-b")
        assert group.state is RunState.EXITED and why in (group.reason or "")
        assert group.failure is not None and group.failure.kind.name == "DEVICE_UNREACHABLE"

    asyncio.run(scenario())


def test_rank_0_exiting_stops_the_ranks_on_the_other_nodes(tmp_path: Path) -> None:
    async def scenario() -> None:
        control = Control(renewals=[None] * 1000)
        group, _ = _group(control, tmp_path, rank0_dies=True)
        await group.start()
        await group.wait_settled()
        assert await asyncio.wait_for(group.wait_exit(), TIMEOUT_S) == 1
        assert control.calls[-1] == ("stop", "node-b") and "rank 0 exited" in (group.reason or "")

    asyncio.run(scenario())


class GroupOption:
    """A vLLM option whose launch has a follower (what a plan over nodes gives the supervisor)."""

    def __init__(self) -> None:
        self.base = vllm.VllmOption("m", vllm.VllmFlags(1, 0.9, 2048, 4, 2048), "m", ("vllm", "serve"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    @property
    def label(self) -> str:
        return "vLLM PP2 over this machine and node-b"

    def launch(self, port: int, api_key: str) -> Any:
        return replace(self.base.launch(port, api_key), followers=(FOLLOWER,))

    def prepare(self) -> GroupOption:
        return self


def test_the_supervisor_replans_over_the_nodes_left_when_a_rank_is_lost(tmp_path: Path) -> None:
    """One fate, end to end with stand-ins: the group serves, node-b's worker goes silent, every rank is
    stopped, the plan is made again (vLLM on this machine alone) and serves; /status says why."""
    one_node = vllm.VllmOption("m", vllm.VllmFlags(1, 0.9, 2048, 4, 2048), "m", ("vllm", "serve"))
    control = Control([GatewayError("silent")] * 3)

    def group_run(run: Any, ctl: Any) -> GroupRun:
        async def answer(_launch: Any) -> str | None:
            return None

        async def tick(_seconds: float) -> None:
            await asyncio.sleep(0)

        return GroupRun(run, ctl, canary=answer, sleep=tick)

    supervisor = _supervisor(
        [GroupOption()], Engines(serves(), serves()), tmp_path, group=control, group_run=group_run,
        replan=answering(lambda: ([one_node], {"decision": "vLLM on this machine"})),
    )  # fmt: skip

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(supervisor.attempts) == 2 and supervisor.state is State.READY)
        status = supervisor.snapshot()
        assert status["group_stops"][0]["why"].startswith("node node-b (rank 1) stopped answering")
        assert status["replans"][0]["options"] == [one_node.label] and ("stop", "node-b") in control.calls
        assert not supervisor.live.launch.followers  # type: ignore[union-attr]
        await supervisor.stop()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S * 2))


def test_the_heads_start_request_is_the_one_the_worker_reads(tmp_path: Path) -> None:
    """One StartRequest: the head writes it (WorkerGroup.start), the worker reads it back; a refusal comes
    back in the worker's words and leaves its running rank as it was."""
    machine = Inventory((), 8 * GIB, 8 * GIB, source="none")
    hosted = {"vllm": Hosted(FakeHost(), Installation(SLEEPER, VERSION, "installed", "cpu"))}
    worker = Worker(WorkerConfig(log_dir=tmp_path, cpu_memory="1GiB"), machine, ["rpc"], hosted)
    served = Served(create_app(worker, ("k",)), lifespan="off")  # a real server: the rank outlives each request
    report = SimpleNamespace(name="node-b", peer_address="127.0.0.1")
    address = f"127.0.0.1:{served.address[1]}"
    group = WorkerGroup(SimpleNamespace(states=[SimpleNamespace(report=report, address=address)], api_key="k"))  # type: ignore[arg-type]
    try:
        asyncio.run(group.start(replace(FOLLOWER, args=("60",)), lease_s=20.0))
        running = worker.followers.state()
        assert running["state"] == "running", running
        assert worker.followers.request == StartRequest("vllm", VERSION, 1, ("60",), "127.0.0.1", 20.0)
        with pytest.raises(RankRefused, match="worker node-b refused rank 99999: rank: an integer from 1 to 4095"):
            asyncio.run(group.start(replace(FOLLOWER, rank=99_999), lease_s=20.0))
        assert worker.followers.state()["pid"] == running["pid"] and worker.followers.running
        asyncio.run(group.stop("node-b"))
        assert not worker.followers.running
    finally:
        served.stop()
