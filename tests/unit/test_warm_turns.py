"""Issue 42: what a later turn of an agent's session prefills again, per engine, and the plan deciding
by it. vLLM's figures follow the releases' source (gateway/backends/vllm/warm_turns.py cites the lines): a
hybrid model's recurrent states are saved at whole attention blocks (544 tokens for Qwen3-Next at TP1
with a 16-bit KV cache, README "Hybrid models"), hits land every ``--prefix-match-unit`` tokens from
0.26, and before 0.26 a hybrid gets no prefix caching unless asked. llama-server resumes 4 tokens
before the previous prompt's end from a context checkpoint (b11434 tools/server/server-context.cpp:3835)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import objective, vllm
from gateway.backends.llamacpp.gguf_facts import estimate_gguf_facts
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.warm_turns import turn as llama_turn
from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts
from gateway.backends.vllm.memory import VllmFlags
from gateway.backends.vllm.warm_turns import planned, turn
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.policy import Goal, Policy
from gateway.planning.planner import evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
GOAL = Goal(65536, 131072)


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((CONFIGS / f"{name}.json").read_text()))


def _facts(name: str, **extra: Any) -> CheckpointFacts:
    return checkpoint_facts({**_config(name), **extra}, name, weight_bytes=40 * GIB, weight_source="safetensors index")


@pytest.mark.parametrize(
    ("version", "unit", "caching", "tokens"),
    [
        ("0.32.0", 16, False, 16),  # --prefix-match-unit 16 inside 544-token blocks
        ("0.26.0", 16, False, 16),  # the flag's first release (arg_utils.py:1201)
        ("0.24.0", None, True, 544),  # prefix caching asked for: hits at whole blocks
        ("0.19.0", None, True, 544),
        ("0.18.0", None, False, 65536),  # no cache mode read before 0.19: the whole conversation
    ],
)
def test_a_hybrids_later_turn_on_vllm_by_release(version: str, unit: int | None, caching: bool, tokens: int) -> None:
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    flags = planned(qwen, VllmFlags(1, 0.92, 65536, 32, 8192), version, on_cpu=False)
    assert (flags.prefix_match_unit, flags.enable_prefix_caching) == (unit, caching)
    found = turn(qwen, flags, version, on_cpu=False)
    assert found is not None and found.tokens == tokens
    argv = build_argv("q", flags, served_name="q", tool_call_parser=None, reasoning_parser=None)
    assert ("--prefix-match-unit" in argv) == bool(unit) and ("--enable-prefix-caching" in argv) == caching
    assert unit is None or argv[argv.index("--prefix-match-unit") + 1] == str(unit)


def test_fp8_kv_doubles_the_block_and_drafting_drops_one_more() -> None:
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    flags = VllmFlags(1, 0.92, 65536, 32, 8192, kv_cache_dtype="fp8", enable_prefix_caching=True)
    found = turn(qwen, flags, "0.24.0", on_cpu=False)
    assert found is not None and found.tokens == 1072  # a 1-byte KV token: about twice the tokens per state page
    drafting = turn(qwen, VllmFlags(1, 0.92, 65536, 32, 8192, speculative_mtp=1, prefix_match_unit=16), "0.32.0", False)
    assert drafting is not None and drafting.tokens == 32  # vllm/v1/core/sched/scheduler.py:316: one more unit


def test_vllm_cpu_matches_every_32_tokens_and_dense_models_are_left_as_they_were() -> None:
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    assert planned(qwen, VllmFlags(1, 0.92, 32768, 4, 2048), "0.32.0", on_cpu=True).prefix_match_unit == 32
    dense = _facts("Qwen3-8B")
    flags = VllmFlags(1, 0.92, 32768, 4, 2048)
    assert planned(dense, flags, "0.32.0", on_cpu=False) == flags and turn(dense, flags, "0.32.0", False) is None


def test_llama_server_resumes_from_a_checkpoint_or_prefills_everything() -> None:
    assert llama_turn(False, 0, 65536) is None  # its cache rolls back: nothing to say
    resumed = llama_turn(True, 8, 65536)
    assert resumed is not None and resumed.tokens == 4 and not objective.Traits(GOAL, 65536, turn_prefill=4).cold_turns
    cold = llama_turn(True, 0, 65536)
    assert cold is not None and cold.tokens == 65536 and objective.Traits(GOAL, 65536, turn_prefill=65536).cold_turns


def test_a_cold_turn_ranks_after_stable_settings_and_before_context() -> None:
    """Floor, stable settings, then warm turns, then context up to the target, precision and speed."""
    warm_short = objective.Traits(GOAL, 65536, weight_bits=4.5, turn_prefill=4)
    cold_long = objective.Traits(GOAL, 131072, weight_bits=16, tokens_per_s=500, turn_prefill=2048)
    fragile_warm = objective.Traits(GOAL, 131072, eager=True, turn_prefill=4)
    order = objective.ranked([fragile_warm, cold_long, warm_short], lambda t: t)
    assert order == [warm_short, cold_long, fragile_warm]
    assert objective.lost_on(warm_short, cold_long) == "re-prefills up to 2,048 tokens every turn"
    just_warm = objective.Traits(GOAL, 131072, turn_prefill=objective.COLD_TURN_TOKENS - 1)
    assert not just_warm.cold_turns and objective.key(just_warm) < objective.key(warm_short)


def _qwen35_plan(version: str) -> Any:
    """A Qwen3.5-class dense hybrid (27B) on 2 x 24 GB: BF16 and an FP8 checkpoint for vLLM, a Q4_K_M GGUF."""
    cfg = _config("qwen3.5-27b-class")
    bf16 = checkpoint_facts(cfg, "Qwen/Qwen3.5-27B", weight_bytes=int(53.8e9), weight_source="safetensors index")
    fp8_cfg = {**cfg, "quantization_config": {"quant_method": "fp8"}}
    fp8 = checkpoint_facts(fp8_cfg, "Qwen/Qwen3.5-27B-FP8", weight_bytes=int(29.4e9), weight_source="safetensors index")
    checkpoints = [vllm.Checkpoint("Qwen/Qwen3.5-27B", bf16), vllm.Checkpoint("Qwen/Qwen3.5-27B-FP8", fp8)]
    engines = engine_plans(
        "q35",
        checkpoints=checkpoints,
        gguf_facts=estimate_gguf_facts(bf16, cfg, 4.85),
        gguf="Qwen3.5-27B-Q4_K_M.gguf",
        launcher=NATIVE,
        vllm_version=version,
    )
    machine = Inventory(parse_gpu_spec("2x24GiB@8.9"), 64 * GIB, 64 * GIB, source="simulated")
    return evaluate_and_choose("q35", engines, machine, Policy(max_context=262144))


def test_a_qwen35_class_hybrid_on_2x24_plans_vllm_fp8_with_its_turns_kept_warm() -> None:
    plan = _qwen35_plan("0.32.0")
    chosen = plan.chosen
    assert plan.decision_backend == "vllm" and chosen.checkpoint.name == "Qwen/Qwen3.5-27B-FP8"
    assert chosen.flags.prefix_match_unit == 16 and chosen.warm_turn.tokens == 16
    assert "--prefix-match-unit 16 inside 400-token blocks" in chosen.reason
    fallback = plan.fallback
    assert fallback is not None and fallback.engine == "llamacpp" and fallback.warm_turn.tokens == 4


def test_the_warm_turn_cost_decides_the_rung_where_fp8_kv_doubles_the_block() -> None:
    """vLLM 0.24 (no --prefix-match-unit): Qwen3-Next-FP8 on one 80 GB card reaches 163,840 with an fp8
    KV cache, whose 1,088-token blocks make every turn re-prefill up to 1,088 tokens; the plan takes the
    16-bit KV rung (544-token blocks) at less context. Ignoring the turn's cost would take the former."""
    cfg = _config("Qwen3-Next-80B-A3B-Instruct")
    fp8 = checkpoint_facts(
        {**cfg, "quantization_config": {"quant_method": "fp8"}},
        "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8",
        weight_bytes=int(81.7e9),
        weight_source="safetensors index",
    )
    engines = engine_plans("next", checkpoints=[vllm.Checkpoint("Qwen/Qwen3-Next-80B-A3B-Instruct-FP8", fp8)],
                           vllm_version="0.24.0")  # fmt: skip
    machine = Inventory(parse_gpu_spec("1x80GiB@9.0"), 64 * GIB, 64 * GIB, source="simulated")
    plan = evaluate_and_choose("next", engines, machine, Policy(max_context=262144))
    chosen = plan.chosen
    assert chosen is not None and chosen.flags.kv_cache_dtype == "auto" and chosen.warm_turn.tokens == 544
    fitting = [c for c in plan.candidates if c.fits]
    longest = max(fitting, key=lambda c: c.context_length)
    assert longest.context_length > chosen.context_length and longest.traits.cold_turns
    ignored = objective.ranked(fitting, lambda c: objective.Traits(**{**c.traits.__dict__, "turn_prefill": 0}))
    assert ignored[0].traits.cold_turns  # without the turn's cost the cold rung wins


def test_the_engine_rule_takes_the_warm_engine_over_a_cold_one_that_comes_first() -> None:
    """vLLM 0.18 has no prefix caching for a hybrid: every turn prefills the whole conversation again;
    llama.cpp resumes from a checkpoint, and wins though vLLM meets the floor without offload."""
    plan = _qwen35_plan("0.19.0")
    assert plan.decision_backend == "vllm"  # --enable-prefix-caching: 400-token blocks, warm enough
    assert plan.chosen.flags.enable_prefix_caching and plan.chosen.warm_turn.tokens == 400
    cfg = _config("Qwen3-Next-80B-A3B-Instruct")
    facts = checkpoint_facts(cfg, "Qwen/Qwen3-Next-80B-A3B-Instruct", weight_bytes=int(40e9), weight_source="index")
    engines = engine_plans(
        "next",
        checkpoints=[vllm.Checkpoint("Qwen/Qwen3-Next-80B-A3B-Instruct", facts)],
        gguf_facts=estimate_gguf_facts(facts, cfg, 4.85),
        gguf="Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf",
        launcher=NATIVE,
        vllm_version="0.18.0",
    )
    machine = Inventory(parse_gpu_spec("1x80GiB@9.0"), 128 * GIB, 128 * GIB, source="simulated")
    plan = evaluate_and_choose("next", engines, machine, Policy(max_context=262144))
    assert plan.decision_backend == "llamacpp", plan.why
    assert plan.why.startswith("llama.cpp meets the floor and keeps agent turns warm (vLLM's best does not)")
    assert "re-prefills up to" in plan.why and plan.fallback is not None and plan.fallback.traits.cold_turns
