"""Issue 29: one objective for both engines (gateway/backends/objective.py), and the decisions it must give
on the machines people own. The family × machine table is tests/unit/test_plan_hub_models.py; here
the issue's own cases and the objective's order, step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.backends import llamacpp, objective, vllm
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.vllm import releases
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.cli.full_settings import Settings
from gateway.core.devices import GIB, Inventory, inventory, parse_gpu_spec
from gateway.core.policy import DEFAULT_MIN_CONTEXT, Goal, Policy, policy_for
from gateway.planning.catalog import builtin_catalog
from gateway.planning.from_settings import plan_for
from gateway.planning.plan_report import render, to_json
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.integration.tools.local_hub import LocalHub
from tests.unit.plan_helpers import engine_plans, objective_broken

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
GOAL = Goal(65536, 131072)


def _glm(gpus: str | None, **settings: object) -> Plan:
    machine = inventory(gpus, "64GiB") if gpus else Inventory((), 64 * GIB, 64 * GIB, source="simulated")
    values = Settings(model="glm-4.7-flash", vllm_version="0.32.0", llama_launcher="native", **settings)
    return plan_for(values, builtin_catalog().resolve("glm-4.7-flash"), machine, serving=False)


def test_the_steps_in_order() -> None:
    """Floor, then no fragile setting, then context up to the target, then precision, then speed."""
    base = objective.Traits(GOAL, 131072, weight_bits=4.5, tokens_per_s=100)
    below = objective.Traits(GOAL, 32768, weight_bits=16, tokens_per_s=300)
    fragile = objective.Traits(GOAL, 202752, raised_utilization=True, weight_bits=16, tokens_per_s=300)
    shorter = objective.Traits(GOAL, 65536, weight_bits=16, tokens_per_s=300)
    coarser = objective.Traits(GOAL, 131072, weight_bits=4.25, tokens_per_s=300)
    slower = objective.Traits(GOAL, 131072, weight_bits=4.5, tokens_per_s=90)
    beyond = objective.Traits(GOAL, 262144, weight_bits=4.5, tokens_per_s=100)  # past the target: equal
    order = objective.ranked([below, fragile, shorter, coarser, slower, base], lambda t: t)
    assert order == [base, slower, coarser, shorter, fragile, below]
    assert objective.key(beyond) < objective.key(base)  # equal up to speed; then the longer context
    assert objective.lost_on(base, fragile) == "needs utilization above the default"
    assert objective.lost_on(base, shorter) == "context 65,536 only"
    crawl = objective.Traits(GOAL, 131072, weight_bits=16, tokens_per_s=2.5)  # BF16 from RAM
    walk = objective.Traits(GOAL, 131072, weight_bits=4.85, tokens_per_s=8.0)
    assert objective.ranked([crawl, walk], lambda t: t) == [walk, crawl]  # precision never buys a crawl


def test_the_default_floor_is_65536_and_the_target_131072() -> None:
    assert DEFAULT_MIN_CONTEXT == 65536 == Settings().min_context and Settings().target_context == 131072
    policy = policy_for(Settings(), 202752, has_gpus=True)
    assert (policy.min_context, policy.goal.target, policy.hard_floor) == (65536, 131072, False)
    small = policy_for(Settings(), 40960, has_gpus=True)  # the model's maximum when smaller
    assert (small.min_context, small.goal.target) == (40960, 40960)
    asked = policy_for(Settings(min_context=98304, target_context=196608), 202752, has_gpus=True)
    assert (asked.min_context, asked.goal.target, asked.hard_floor) == (98304, 196608, True)
    cpu = policy_for(Settings(), 202752, has_gpus=False)
    assert (cpu.min_context, cpu.goal.target) == (32768, 32768)


def test_the_seed_machine_plans_nvfp4_past_the_target_at_the_default_utilization() -> None:
    """`gateway plan --model glm-4.7-flash --gpus 2x32GiB@12.0`: BF16 fits only at utilization 0.97
    with 8 sequences; the NVFP4 checkpoint at the release's default reaches the model's maximum."""
    plan = _glm("2x32GiB@12.0")
    chosen = plan.chosen
    assert isinstance(chosen, vllm.VllmCandidate) and chosen.checkpoint.name == "unsloth/GLM-4.7-Flash-NVFP4"
    assert chosen.context_length >= 131072 and chosen.flags.max_num_seqs >= 4 and not chosen.flags.enforce_eager
    assert chosen.flags.gpu_memory_utilization == releases.default_utilization("0.32.0")
    assert objective_broken(to_json(plan, 8000), releases.default_utilization("0.32.0")) is None


def test_two_rtx_4090s_reach_the_floor_without_raising_the_utilization() -> None:
    plan = _glm("2x24GiB@8.9")
    chosen = plan.chosen
    assert isinstance(chosen, vllm.VllmCandidate) and chosen.context_length >= 65536
    assert chosen.flags.gpu_memory_utilization <= releases.default_utilization("0.32.0")
    assert not chosen.traits.fragile()


def test_qwen3_coder_on_two_16gb_cards_reaches_131072_with_every_layer_and_expert_on_the_gpus(hub: LocalHub) -> None:
    """Before: Q6_K at 65,536 (~123 tokens/s). Q6_K reaches 131,072 only with experts in RAM; Q5_K_M
    reaches it with every layer and expert on the cards."""
    model = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
    settings = Settings(model=model, llama_launcher="native", engine="llamacpp")
    plan = plan_for(settings, builtin_catalog().resolve(model), inventory("2x16GiB@8.9", "64GiB"), serving=False)
    chosen = plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate) and chosen.variant["quant"] == "Q5_K_M"
    assert chosen.n_ctx == 131072 and chosen.all_on_gpus and chosen.placement.n_cpu_moe == 0
    q6 = next(row for row in chosen.alternatives if row["quant"] == "Q6_K")
    assert q6["fits"] and (q6["n_ctx"] < 131072 or q6["layers_on_gpu"] < q6["layers"])


def test_a_q8_0_kv_cache_is_taken_for_context_not_for_its_decode_estimate() -> None:
    """On a CPU both KV types reach the same context: f16 is kept, though the decode estimate prices q8_0
    higher, because q8_0 costs prefill (measured with llama-server b11434 on this machine, SmolLM2-135M,
    one thread, 1,602-token prompt: prefill 41 vs 73 tokens/s, decode 21.8 vs 20.1) and an agent's turn
    is mostly prefill. Where q8_0 buys context it is taken (the two-card rows of the plan table)."""
    plan = _glm(None)
    chosen = plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate) and chosen.placement.n_gpu_layers == 0
    same = [c for c in plan.candidates_of("llamacpp") if c.fits and c.n_ctx == chosen.n_ctx and not c.optional]
    assert {c.kv_type for c in same} == {"f16", "q8_0"}
    assert chosen.kv_type == "f16"
    assert objective.key(chosen.traits) < objective.key(next(c for c in same if c.kv_type == "q8_0").traits)


def test_below_the_floor_is_a_last_resort_and_said_loudly() -> None:
    """Llama-3.1-8B BF16 on one 20 GiB card with 3 GiB of RAM: vLLM's KV holds far less than 65,536, llama.cpp
    cannot put enough in RAM for 65,536; the longest below the floor is offered, and the plan says so."""
    config = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    facts = checkpoint_facts(config, "meta-llama/Llama-3.1-8B-Instruct")
    gguf = llamacpp.estimate_gguf_facts(facts, config, 16.0)
    engines = engine_plans("llama", checkpoints=[vllm.Checkpoint("meta-llama/Llama-3.1-8B-Instruct", facts)],
                           gguf_facts=gguf, launcher=NATIVE)  # fmt: skip
    machine = Inventory(parse_gpu_spec("1x20GiB@8.9"), 3 * GIB, 3 * GIB, source="simulated")
    plan = evaluate_and_choose("llama", engines, machine, Policy(max_context=131072))
    chosen = plan.chosen
    assert chosen is not None and plan.last_resort and chosen.context_length < 65536
    assert plan.why.startswith("LAST RESORT: nothing reaches the 65,536-token floor: context ")
    assert render(plan).startswith("decision (LAST RESORT: below the 65,536-token floor): ")
    hard = evaluate_and_choose("llama", engines, machine, Policy(max_context=131072, hard_floor=True))
    assert hard.chosen is None  # --min-context given: nothing below it is planned


@pytest.mark.parametrize("pinned", ["gpu_memory_utilization", "max_num_seqs"])
def test_what_the_user_pinned_is_never_counted_as_fragile(pinned: str) -> None:
    values = {"gpu_memory_utilization": 0.97, "max_num_seqs": 2}
    plan = _glm("2x32GiB@12.0", **{pinned: values[pinned]})
    chosen = plan.chosen
    assert isinstance(chosen, vllm.VllmCandidate) and not chosen.traits.fragile()


def test_no_third_party_progress_bar_while_the_model_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's "Parse safetensors files" bars landed in the plan's text (issue 29): they are
    off while the engines read the model's facts, and as they were afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars  # type: ignore[attr-defined]

    from gateway.planning import from_settings

    seen: list[bool] = []
    real = from_settings.read_engines
    monkeypatch.setattr(
        from_settings, "read_engines", lambda *args: seen.append(are_progress_bars_disabled()) or real(*args)
    )
    enable_progress_bars()
    _glm("2x32GiB@12.0")
    assert seen == [True] and not are_progress_bars_disabled()
