"""More than one engine (issue 50, item 1): the plan weighs one engine over the machine against replicas of
the model, each on GPUs of one node that hold it at the floor on their own; --replicas N|auto; the JSON lists
each replica as the runtime starts it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import vllm
from gateway.backends.base import Installation
from gateway.backends.llamacpp import estimate_gguf_facts
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.cli.commands import main
from gateway.cli.full_settings import Settings as FullSettings
from gateway.core.devices import GIB, Device, Inventory, Peer
from gateway.core.errors import ConfigError
from gateway.core.policy import Policy
from gateway.core.settings import Settings
from gateway.planning.catalog import builtin_catalog
from gateway.planning.plan_report import render
from gateway.planning.planner import Plan, evaluate_and_choose
from gateway.planning.replicas import REPLICA_GAIN, layouts, weigh
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
TWO_NODES = ["--gpus", "2x32GiB@12.0", "--remote-gpus", "node2=2x32GiB@12.0", "--ram", "64GiB"]
GLM = ["--model", "glm-4.7-flash", "--vllm-version", "0.32.0", "--sessions", "16"]


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["plan", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.fixture(scope="module")
def two_nodes_auto() -> dict[str, dict[str, Any]]:
    """The issue's rig's plan (``GLM`` on ``TWO_NODES``, replicas auto) once it is made: three tests read it."""
    return {}


def _auto_plan(capsys: pytest.CaptureFixture[str], made: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if "plan" not in made:
        made["plan"] = _plan_json(capsys, *GLM, *TWO_NODES)
    return made["plan"]


def _gpus(count: int, node: str = "", gib: int = 24) -> tuple[Device, ...]:
    return tuple(Device(i, "RTX 4090", gib * GIB, gib * GIB, (8, 9), node=node) for i in range(count))


def _machine(local: int, *remote: tuple[str, int], peers: bool = False, gib: int = 24) -> Inventory:
    others = tuple(gpu for node, count in remote for gpu in _gpus(count, node, gib))
    ready = tuple(
        Peer(node, {"vllm": vllm.DEFAULT_VERSION}, f"10.0.0.{i + 2}", "10.0.0.1", "eth0")
        for i, (node, _) in enumerate(remote)
    )
    return Inventory(
        _gpus(local), 128 * GIB, 128 * GIB, source="simulated", remote=others, peers=ready if peers else ()
    )


def _glm_plan(inventory: Inventory, *, bf16_only: bool = False, sessions: int = 16) -> Plan:
    checkpoints = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints
    engines = engine_plans(
        "glm-4.7-flash", checkpoints=checkpoints[:1] if bf16_only else checkpoints, parsers=("glm47", "glm45")
    )
    return evaluate_and_choose("glm-4.7-flash", engines, inventory, Policy(sessions=sessions))


def _qwen3_8b(inventory: Inventory, sessions: int = 4, *, gguf: bool = False) -> Plan:
    config = json.loads((CONFIGS / "Qwen3-8B.json").read_text())
    facts = checkpoint_facts(config, "Qwen/Qwen3-8B")
    engines = engine_plans(
        "qwen3-8b",
        checkpoints=[vllm.Checkpoint("Qwen/Qwen3-8B", facts)],
        gguf_facts=estimate_gguf_facts(facts, config, 4.85) if gguf else None,
        gguf="Qwen3-8B-Q4_K_M.gguf",
        launcher=NATIVE,
    )
    policy = Policy(min_context=32768, target_context=40960, sessions=sessions)  # its own limit: 40,960
    return evaluate_and_choose("qwen3-8b", engines, inventory, policy)


# --- the layouts a machine offers -------------------------------------------------------------------------


def test_layouts_cut_each_node_into_units_of_its_own_gpus() -> None:
    """Units never span nodes: two nodes of two GPUs give four single GPUs, or each node's pair."""
    cuts = layouts(_machine(2, ("node2", 2)))
    assert [[(u.node, [d.index for d in u.devices]) for u in cut] for cut in cuts] == [
        [("", [0]), ("", [1]), ("node2", [0]), ("node2", [1])],
        [("", [0, 1]), ("node2", [0, 1])],
    ]


def test_four_gpus_of_one_node_offer_four_singles_or_two_pairs_and_one_gpu_offers_nothing() -> None:
    cuts = layouts(_machine(4))
    assert [[[d.index for d in u.devices] for u in cut] for cut in cuts] == [[[0], [1], [2], [3]], [[0, 1], [2, 3]]]
    assert layouts(_machine(1)) == [] and layouts(Inventory((), 64 * GIB, 64 * GIB)) == []


# --- the choice ----------------------------------------------------------------------------------------------


def test_two_nodes_plan_replicas_each_on_one_node_not_pipeline_stages_across_them(
    capsys: pytest.CaptureFixture[str], two_nodes_auto: dict[str, dict[str, Any]]
) -> None:
    """The issue's rig: two workstations of 2×32 GB and 16 sessions. Every replica stays on one node's GPUs;
    pooling both nodes (TP2×PP2) is weighed, shown, and decodes less: every step crosses the link."""
    data = _auto_plan(capsys, two_nodes_auto)
    shape = data["replicas"]
    assert shape["asked"] == "auto" and shape["engines"] >= 2
    for replica in shape["replicas"]:
        nodes = {label.partition("/")[0] if "/" in label else "" for label in replica["devices"]}
        assert nodes == {replica["node"]}
        assert "pipeline_parallel_size" not in replica["candidate"]
        assert replica["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(
            label.rpartition("/")[2] for label in replica["devices"]
        )
    assert {r["node"] for r in shape["replicas"]} == {"", "node2"}
    pooled = shape["pooled"]
    assert pooled["replicas"][0]["candidate"]["pipeline_parallel_size"] == 2
    assert pooled["replicas"][0]["candidate"]["nodes"] == ["node2"]
    assert shape["decode_tokens_per_s"] > REPLICA_GAIN * pooled["decode_tokens_per_s"]
    assert shape["warm_at_typical_prompt"] >= 16
    one = shape["other"]  # the plan's one engine as it stands: TP2 on this machine, node2 idle
    assert one["engines"] == 1 and one["where"] == [{"node": "", "devices": ["0", "1"]}]
    assert one["warm_at_typical_prompt"] < 16 and "one engine: 10" in shape["why"]
    assert data["decision"]["backend"] == "vllm"  # the one engine `serve` starts until it can start replicas


def test_the_plan_says_why_four_single_gpu_replicas_and_not_one_tp2_replica_per_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The done-when expected two TP2 replicas. By the objective's order both reach the 131,072 target (the
    comparison counts context up to it) and keep every session warm; four TP1 decode more with the 16 at once,
    and the plan says where two TP2 would be faster. Before: two TP2 showed only as "also weighed", no why."""
    data = _plan_json(capsys, *GLM, *TWO_NODES)
    shape = data["replicas"]
    assert shape["engines"] == 4 and all(len(r["devices"]) == 1 for r in shape["replicas"])
    rival = shape["weighed"][0]
    assert rival["engines"] == 2 and rival["warm_at_typical_prompt"] >= 16 and rival["context_length"] == 202752
    assert shape["context_length"] >= 131072 and shape["decode_tokens_per_s"] > rival["decode_tokens_per_s"]
    why_not = shape["why_not"]
    assert why_not.startswith("2 replicas of 2 GPUs: both reach the 131,072-token target")
    assert "keep 16 of the 16 sessions asked for warm" in why_not
    assert "2 replicas of 2 GPUs are faster only with 2 requests or fewer at once" in why_not
    assert main(["plan", *GLM, *TWO_NODES]) == 0
    assert f"\nwhy not {why_not}\n" in capsys.readouterr().out


def test_one_node_of_two_gpus_says_where_its_one_engine_would_be_faster(capsys: pytest.CaptureFixture[str]) -> None:
    """The seed rig with the default 4 sessions: two TP1 replicas by the objective (both keep the 4 warm, ×1.47
    with the 4 at once); the why line says the TP2 engine is faster with one request alone."""
    seed = ["--model", "glm-4.7-flash", "--vllm-version", "0.32.0", "--gpus", "2x32GiB@12.0", "--ram", "64GiB"]
    shape = _plan_json(capsys, *seed)["replicas"]
    assert shape["engines"] == 2 and shape["other"]["engines"] == 1
    assert "one engine is faster only with 1 request at once" in shape["why"]


def test_replicas_2_runs_one_tp2_engine_on_each_node(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(capsys, *GLM, *TWO_NODES, "--replicas", "2")
    shape = data["replicas"]
    assert shape["asked"] == 2 and shape["engines"] == 2
    assert shape["why"].startswith("--replicas 2, as asked; 2 replicas: 16 of the 16 sessions asked for kept warm")
    first, second = shape["replicas"]
    assert (first["node"], first["devices"], second["node"], second["devices"]) == (
        "",
        ["0", "1"],
        "node2",
        ["node2/0", "node2/1"],
    )
    for replica in (first, second):
        assert replica["candidate"]["tensor_parallel_size"] == 2
        assert replica["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and replica["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert replica["sessions"] == 8 and replica["context_length"] == 202752
        assert set(replica) >= {"index", "backend", "at_once", "argv", "command", "port", "warm_at_typical_prompt"}
        assert replica["command"].startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 ")
        assert "--tensor-parallel-size 2" in replica["command"] and "--pipeline-parallel-size" not in replica["command"]
    assert first["port"] == second["port"] == 8000  # each on its own node


def test_replicas_1_keeps_the_one_engine_and_shows_the_replicas_beside_it(
    capsys: pytest.CaptureFixture[str], two_nodes_auto: dict[str, dict[str, Any]]
) -> None:
    auto = _auto_plan(capsys, two_nodes_auto)
    data = _plan_json(capsys, *GLM, *TWO_NODES, "--replicas", "1")
    shape = data["replicas"]
    assert (
        shape["asked"] == 1
        and shape["engines"] == 1
        and shape["why"].startswith("--replicas 1, as asked; one engine: ")
    )
    assert shape["other"]["engines"] == auto["replicas"]["engines"]
    assert {k: v for k, v in data.items() if k != "replicas"} == {k: v for k, v in auto.items() if k != "replicas"}
    assert main(["plan", *GLM, *TWO_NODES, "--replicas", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decision: vLLM: unsloth/GLM-4.7-Flash-NVFP4 (nvfp4), TP2")
    assert "\nshape: --replicas 1, as asked; one engine: 10 of the 16" in text and "  other shape: 4 replicas" in text


def test_more_replicas_than_fit_is_refused_naming_how_many_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *GLM, *TWO_NODES, "--replicas", "8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--replicas 8: at most 4 replicas of glm-4.7-flash meet the 65,536-token floor here" in err
    assert err.endswith("pass --replicas 4 or auto")


def test_the_replicas_setting_is_a_count_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    assert Settings().replica_count is None and Settings(replicas="3").replica_count == 3
    assert Settings(replicas=2).replicas == "2" and Settings(replicas="AUTO").replica_count is None
    for bad in ("0", "x", "-1", "65"):
        with pytest.raises(ValueError, match="give a number from 1 to 64, or auto"):
            Settings(replicas=bad)
    assert main(["plan", *GLM, *TWO_NODES, "--replicas", "zero"]) == 1
    assert "give a number from 1 to 64, or auto" in capsys.readouterr().err


def test_a_model_no_single_node_holds_still_plans_one_pooled_engine() -> None:
    """GLM-4.7-Flash in BF16 on two nodes of 2×24 GB: no node holds it, both together do (TP2×PP2)."""
    plan = _glm_plan(_machine(2, ("node2", 2), peers=True), bf16_only=True)
    assert plan.chosen is not None and plan.chosen.nodes == ("node2",)
    shaped = weigh(plan, None)
    assert shaped is not None and shaped.chosen.count == 1 and shaped.other is None and shaped.pooled is None
    assert shaped.why == "one engine: no GPUs of one node hold the model at the 65,536-token floor on their own"
    assert not shaped.shown  # its JSON stays as it was
    with pytest.raises(ConfigError, match="no GPUs of one node hold glm-4.7-flash at the 65,536-token floor"):
        weigh(plan, 2)


def test_engine_flags_that_pool_the_nodes_keep_one_engine() -> None:
    """--pipeline-parallel-size 2 over two nodes whose workers run vLLM: the user asked for one engine over
    both; replicas are shown, not chosen, unless a number of them is asked for."""
    plan = _glm_plan(_machine(2, ("node2", 2), peers=True))
    pinned = replace(plan.policy, pins=replace(plan.policy.pins, engine={"pipeline_parallel_size": 2}))
    engines = [replace(e, evaluation=type(e.evaluation)()) for e in plan.engines]
    plan = evaluate_and_choose("glm-4.7-flash", engines, plan.inventory, pinned)
    assert plan.chosen is not None and plan.chosen.nodes == ("node2",)
    shaped = weigh(plan, None)
    assert shaped is not None and shaped.chosen.count == 1 and shaped.other is not None and shaped.other.count >= 2
    assert shaped.why.startswith("one engine: the engine flags given pool the nodes")
    forced = weigh(plan, 2)
    assert forced is not None and forced.chosen.count == 2


def test_a_dense_model_on_one_node_stays_one_tensor_parallel_engine() -> None:
    """Qwen3-8B in BF16 on 2×32 GB: one TP2 engine holds it with a 16-bit cache and more sessions warm; a copy
    on each GPU needs an fp8 cache: one engine, and its JSON is what it was before replicas were weighed."""
    plan = _qwen3_8b(_machine(2, gib=32), sessions=16)
    shaped = weigh(plan, None)
    assert shaped is not None and shaped.chosen.count == 1 and shaped.other is not None and shaped.other.count == 2
    assert shaped.chosen.warm > shaped.other.warm
    assert not shaped.shown
    plan.replication = shaped
    assert "replicas" not in plan.to_json()
    assert plan.replicas[0].plan is plan and plan.replicas[0].env == {}
    text = render(plan)
    assert "\nshape: one engine; 2 replicas: less precise (16 bits per weight, 8-bit KV)" in text  # fp8 KV to fit
    assert "\n  other shape: 2 replicas: vLLM Qwen/Qwen3-8B (bfloat16), TP1 on" in text


def test_replicas_on_unequal_nodes_serve_one_engine_at_one_context() -> None:
    """A 2×32 GB node and a 2×24 GB one: each replica's own best would differ; every session can go to any
    replica, so they are planned again on one engine at the shorter context."""
    big = tuple(replace(d, total_bytes=32 * GIB, free_bytes=32 * GIB) for d in _gpus(2))
    machine = Inventory(big, 128 * GIB, 128 * GIB, source="simulated", remote=_gpus(2, "node2"))
    plan = _qwen3_8b(machine, sessions=16)
    shaped = weigh(plan, 2)
    assert shaped is not None and shaped.chosen.count == 2
    decided = [r.chosen for r in shaped.chosen.replicas]
    assert len({(c.engine, c.context_length) for c in decided}) == 1


def test_the_runtime_gets_each_replica_with_its_own_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """Plan.replicas is what a runtime starts: each replica's plan is made on its GPUs numbered from 0 (as
    the engine sees them through CUDA_VISIBLE_DEVICES), and its options come from that plan."""
    plan = _glm_plan(_machine(4), sessions=16)
    shaped = weigh(plan, 2)
    assert shaped is not None
    pairs = next(s for s in (shaped.chosen, *shaped.weighed) if not s.grouped)  # two engines of their own
    plan.replication = replace(shaped, chosen=pairs)
    first, second = plan.replicas
    assert [d.index for d in first.devices] == [0, 1] and [d.index for d in second.devices] == [2, 3]
    assert second.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert [d.index for d in second.plan.inventory.gpus] == [0, 1] and second.plan.inventory.remote == ()
    assert second.plan.policy.sessions == 8 and second.sessions == 8


# --- the figures the choice weighs ------------------------------------------------------------------------


def test_many_requests_decode_faster_together_and_one_request_is_the_one_request_estimate() -> None:
    plan = _qwen3_8b(_machine(2), gguf=True)
    for engine in plan.engines:
        best = engine.best
        assert best is not None
        assert best.decode_rate(1) == pytest.approx(best.tokens_per_s, rel=1e-9)  # type: ignore[attr-defined]
        assert best.decode_rate(1) < best.decode_rate(8) < 8 * best.decode_rate(1)


def test_pipeline_stages_across_nodes_pay_the_link_on_every_step() -> None:
    plan = _glm_plan(_machine(2, ("node2", 2), peers=True), bf16_only=True)
    pooled = plan.chosen
    assert isinstance(pooled, vllm.VllmCandidate) and pooled.pipeline_parallel_size == 2
    assert pooled.link_rtt_s == pytest.approx(0.0005)  # unmeasured: the default LAN round trip
    free = replace(pooled, link_rtt_s=0.0)
    assert pooled.decode_rate(16) < free.decode_rate(16)
    assert pooled.decode_rate(1) < free.decode_rate(1) < pooled.tokens_per_s  # two stages one after another


def test_llamacpp_rpc_devices_on_another_node_pay_the_link() -> None:
    machine = _machine(1, ("node2", 1))
    plan = _qwen3_8b(machine, gguf=True)
    llama = plan.engine("llamacpp")
    assert llama is not None and llama.best is not None and llama.best.nodes == ("node2",)
    assert llama.best.decode_rate(1) < llama.best.tokens_per_s  # type: ignore[attr-defined]


# --- vLLM's own data parallelism (gateway/backends/vllm/data_parallel.py) ------------------------------------------


def test_a_moe_one_gpu_cannot_hold_runs_as_one_data_parallel_group_with_its_experts_spread() -> None:
    """GLM-4.7-Flash in BF16 on one node of 4×24 GB: no GPU or pair holds it alone; four ranks that each hold a
    quarter of the experts and a whole cache keep every session warm, where one TP4 engine copies the MLA
    cache onto every GPU. The group is ONE engine over the four GPUs (one `vllm serve`, one fate, one port)."""
    plan = _glm_plan(_machine(4), bf16_only=True)
    shaped = weigh(plan, None)
    assert shaped is not None and shaped.chosen.grouped and shaped.chosen.count == 4
    assert shaped.other is not None and shaped.other.count == 1 and shaped.chosen.warm > shaped.other.warm
    plan.replication = shaped
    data = plan.to_json()["replicas"]
    assert data["group"] is True and data["engines"] == 1 and data["ranks"] == 4
    (engine_json,) = data["replicas"]  # what serve starts: one engine over every rank's GPUs
    argv = engine_json["argv"]
    assert argv[argv.index("--data-parallel-size") + 1] == "4" == argv[argv.index("--data-parallel-size-local") + 1]
    assert "--enable-expert-parallel" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert not {"--data-parallel-rank", "--data-parallel-address", "--headless"} & set(argv)  # vLLM balances
    assert engine_json["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and engine_json["ranks"] == 4
    assert engine_json["warm_at_typical_prompt"] == shaped.chosen.warm == data["warm_at_typical_prompt"]
    assert engine_json["decode_tokens_per_s"] == pytest.approx(shaped.chosen.decode, abs=0.1)
    assert plan.replicas == shaped.chosen.engines and len(plan.replicas) == 1
    rank = shaped.chosen.replicas[0].chosen
    assert isinstance(rank, vllm.VllmCandidate)
    whole = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints[0]
    assert rank.checkpoint.name == whole.name and rank.memory.weights < whole.facts.weight_bytes / 2
    text = render(plan)
    assert text.startswith("decision: one vLLM engine, a data-parallel group of 4 ranks (they step together")
    assert "  the group's engine (4 ranks) on this machine's GPUs 0,1,2,3, port 8000:" in text
    first = shaped.chosen.engines[0]  # what a runtime starts: the group's option over its GPUs
    engine = first.plan.engine("vllm")
    assert engine is not None and engine.model is not None
    installed = replace(engine.installation, command=("vllm", "serve"))
    option = vllm.BACKEND.options(engine.model, engine.evaluation, first.plan.policy, installed, FullSettings())[0]
    launched = option.launch(8001, "key").argv
    assert launched[launched.index("--data-parallel-size-local") + 1] == "4" and "DP4 with EP" in option.label


def test_no_group_spans_nodes_and_none_is_taken_where_replicas_of_their_own_do_as_well(
    capsys: pytest.CaptureFixture[str], two_nodes_auto: dict[str, dict[str, Any]]
) -> None:
    """Ranks on two nodes would exchange every token over the network twice per MoE layer: never planned. On
    the seed rig with 4 sessions, replicas of their own keep every session warm: no group either."""
    data = _auto_plan(capsys, two_nodes_auto)
    shapes = [data["replicas"], data["replicas"]["other"], *data["replicas"]["weighed"]]
    assert not any(s["group"] and len({w["node"] for w in s["where"]}) > 1 for s in shapes)
    seed = _plan_json(capsys, "--model", "glm-4.7-flash", "--gpus", "2x32GiB@12.0", "--ram", "64GiB", "--sessions", "4")
    assert seed["replicas"]["group"] is False and not any(s["group"] for s in seed["replicas"]["weighed"])


def test_a_dense_model_is_never_a_data_parallel_group() -> None:
    """vLLM 0.32.0 refuses a dense model's external ranks (arg_utils.py: "Non-MoE models do not support
    external data parallel mode"), and its internal ranks are independent engines: replicas of their own."""
    config = json.loads((CONFIGS / "Qwen3-8B.json").read_text())
    model = vllm.VllmModel("qwen3-8b", [vllm.Checkpoint("Qwen/Qwen3-8B", checkpoint_facts(config, "Qwen/Qwen3-8B"))])
    found = vllm.BACKEND.candidates(
        model, _machine(2, gib=32), Policy(data_parallel=2), Installation(None, vllm.DEFAULT_VERSION, "given")
    )
    assert found.candidates == [] and any("not a MoE" in note for note in found.notes)
    assert weigh(_qwen3_8b(_machine(2, gib=32), sessions=16), None) is not None


def test_a_moe_step_reads_the_experts_its_requests_route_to() -> None:
    """One token reads k of E experts; a batch reads their union; a rank of a group reads its own share of the
    experts as every rank's tokens route to them."""
    from gateway.backends.vllm.estimate import expert_fraction, routed_share

    facts = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints[0].facts
    experts, routed = expert_fraction(facts), facts.experts_per_token / facts.num_experts
    assert 0.5 < experts <= 0.95
    assert routed_share(facts, 1) == pytest.approx(1 - experts * (1 - routed))
    assert routed_share(facts, 1) < routed_share(facts, 8) < routed_share(facts, 64) < 1
    held = experts / 4
    every = 1 - (1 - routed) ** 16  # four ranks' four requests each reach a rank's experts
    assert routed_share(facts, 4, ranks=4) == pytest.approx((1 - experts + held * every) / (1 - experts + held))


def test_replicas_asked_on_a_cpu_are_copies_of_its_plan_and_never_chosen_by_auto() -> None:
    """Before: --replicas 2 on a machine with no GPU was refused ("one GPU or none"), so replicas could not
    be started where the tests run. Each copy is the CPU plan (serve gives each its share of the cores)."""
    cpu = Inventory((), 64 * GIB, 64 * GIB, source="simulated")
    plan = _qwen3_8b(cpu, sessions=4, gguf=True)
    assert plan.chosen is not None and weigh(plan, None) is None  # auto: one engine
    replication = weigh(plan, 2)
    assert replication is not None and replication.chosen.count == 2 and replication.asked == 2
    assert [(r.index, r.node, r.devices, r.env, r.sessions) for r in replication.chosen.replicas] == [
        (0, "", (), {}, 2),
        (1, "", (), {}, 2),
    ]
    assert all(r.plan is plan for r in replication.chosen.replicas)
    with pytest.raises(ConfigError, match="one GPU or none"):
        weigh(_qwen3_8b(Inventory(_gpus(1), 64 * GIB, 64 * GIB, source="simulated"), gguf=True), 2)
