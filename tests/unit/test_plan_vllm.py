"""vLLM memory terms and the ladder on the scenarios the product is judged by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.backends import vllm
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.policy import Pins, Policy
from gateway.planning.catalog import builtin_catalog
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
RTX_5090_PAIR = "2x32607MiB@12.0"


def _machine(spec: str, ram_gib: int = 64) -> Inventory:
    return Inventory(parse_gpu_spec(spec), ram_gib * GIB, ram_gib * GIB, source="simulated")


def _glm_checkpoints() -> list[vllm.Checkpoint]:
    return vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints


def _glm_plan(spec: str = RTX_5090_PAIR, version: str = "0.32.0", pins: Pins | None = None) -> Plan:
    parsers = ("glm47", "glm45")
    engines = engine_plans("glm-4.7-flash", checkpoints=_glm_checkpoints(), vllm_version=version, parsers=parsers)
    return evaluate_and_choose("glm-4.7-flash", engines, _machine(spec), Policy(pins=pins or Pins()))


def test_glm_bf16_puts_28_to_29_gib_of_weights_on_each_of_two_gpus() -> None:
    plan = _glm_plan()
    tp2 = [
        c for c in plan.candidates_of("vllm") if c.flags.tensor_parallel_size == 2 and c.checkpoint.quantization is None
    ]
    assert tp2
    assert 27.5 * GIB < tp2[0].memory.weights < 29.5 * GIB


def test_glm_on_two_5090s_takes_nvfp4_at_the_default_utilization_not_tuned_bf16() -> None:
    """Issue 29's seed machine: BF16 fits only with tuned limits (a fragile utilization, few
    sequences), so the pre-quantized NVFP4 checkpoint at the release's default share wins, at more
    than the 131,072 target."""
    plan = _glm_plan()
    chosen = plan.chosen
    assert plan.decision_backend == "vllm" and isinstance(chosen, vllm.VllmCandidate)
    assert chosen.checkpoint.quantization == "nvfp4" and chosen.flags.tensor_parallel_size == 2
    assert chosen.flags.gpu_memory_utilization == vllm.DEFAULT_UTILIZATION and not chosen.flags.enforce_eager
    assert chosen.flags.max_model_len >= 131072 and chosen.flags.max_num_seqs >= 4
    bf16 = vllm.ranked([c for c in plan.candidates_of("vllm") if c.checkpoint.quantization is None])
    best_bf16 = bf16[0]  # the original BF16 checkpoint still fits...
    assert best_bf16.flags.gpu_memory_utilization > vllm.DEFAULT_UTILIZATION  # ...with more of the card,
    assert best_bf16.flags.max_num_seqs <= 32  # and few sequences, which capture few CUDA graphs
    assert best_bf16.memory.cudagraph < 0.5 * GIB
    assert best_bf16.memory.kv_tokens >= best_bf16.flags.max_model_len >= 32768
    assert best_bf16.traits.raised_utilization and not chosen.traits.fragile()
    defaults = [
        c
        for c in plan.candidates_of("vllm")
        if c.concessions == vllm.Concessions() and c.flags.tensor_parallel_size == 2
    ]
    assert defaults and not any(c.fits for c in defaults)
    assert "leave no KV cache" in defaults[0].reason
    assert "needs utilization above the default" in plan.why


def test_glm_kv_per_token_is_mla_now_and_was_17x_larger_before_january_2026() -> None:
    facts = _glm_checkpoints()[0].facts
    assert vllm.kv_bytes_per_token(facts, 2, "auto", "0.32.0") == 47 * 576 * 2  # 54,144: MLA latent
    assert vllm.kv_bytes_per_token(facts, 2, "fp8", "0.32.0") == 47 * 576
    before = vllm.kv_bytes_per_token(facts, 1, "auto", "0.14.0")
    assert before == 47 * 20 * (192 + 64 + 256) * 2  # 20 full heads of K (256) and V (256)
    assert 17 < before / (47 * 576 * 2) < 18


def test_the_nvfp4_checkpoint_leaves_far_more_room() -> None:
    plan = _glm_plan()
    nvfp4 = [
        c
        for c in plan.candidates_of("vllm")
        if c.checkpoint.quantization == "nvfp4" and c.concessions == vllm.Concessions(checkpoint=1)
    ]
    bf16 = max(c.memory.kv_cache for c in plan.candidates_of("vllm") if c.checkpoint.quantization is None)
    assert nvfp4 and nvfp4[0].fits
    assert nvfp4[0].memory.kv_cache > 5 * bf16
    assert nvfp4[0].memory.weights < 10 * GIB


def test_nvfp4_runs_from_compute_capability_7_5_and_is_refused_below() -> None:
    """ModelOptNvFp4Config.get_min_capability is 75 in every release read (Marlin W4A16 below 10.0):
    a 4090 (8.9) runs the NVFP4 checkpoint, a V100 (7.0) does not."""
    ada = _glm_plan(spec="2x24GiB@8.9")
    nvfp4 = [c for c in ada.candidates_of("vllm") if c.checkpoint.quantization == "nvfp4"]
    assert nvfp4 and any(c.fits for c in nvfp4)
    volta = _glm_plan(spec="2x32GiB@7.0")
    refused = [c for c in volta.candidates_of("vllm") if c.checkpoint.quantization == "nvfp4"]
    assert refused and not any(c.fits or c.startable for c in refused)
    assert "needs compute capability 7.5+" in refused[0].reason and "modelopt.py:" in refused[0].reason


def test_tp_sizes_divide_the_heads_and_fit_the_gpu_count() -> None:
    facts = checkpoint_facts(
        {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2}, "tiny"
    )
    assert vllm.valid_tp_sizes(facts, 4) == [2, 1]  # 14 heads: TP4 never proposed
    assert vllm.valid_tp_sizes(facts, 1) == [1]


def test_kv_heads_fewer_than_tp_are_replicated() -> None:
    qwen3_moe = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    facts = checkpoint_facts(qwen3_moe, "Qwen3-30B-A3B")
    assert facts.num_kv_heads == 4
    at_tp4 = vllm.kv_bytes_per_token(facts, 4, "auto", "0.32.0")
    assert at_tp4 == 48 * 2 * 1 * 128 * 2 == 24576
    assert vllm.kv_bytes_per_token(facts, 8, "auto", "0.32.0") == at_tp4  # one head per GPU, not half


def test_pinned_flags_are_evaluated_exactly() -> None:
    pinned = Pins(
        context_length=32768, engine={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.92, "max_num_seqs": 256}
    )
    plan = _glm_plan(pins=pinned)
    bf16 = [c for c in plan.candidates_of("vllm") if c.checkpoint.quantization is None]
    assert {c.flags.tensor_parallel_size for c in bf16} == {2}
    assert {c.flags.gpu_memory_utilization for c in bf16} == {0.92}
    assert {c.flags.max_model_len for c in bf16} == {32768}
    exact = [c for c in bf16 if not c.flags.enforce_eager and c.flags.kv_cache_dtype == "auto"]
    assert len(exact) == 1 and not exact[0].fits


def test_free_memory_below_the_requested_share_is_refused_with_numbers() -> None:
    plan = _glm_plan(spec="2x32607MiB@12.0:free=20GiB", pins=Pins(engine={"gpu_memory_utilization": 0.92}))
    assert not any(c.fits for c in plan.candidates_of("vllm") if c.checkpoint.quantization is None)
    assert any("vLLM refuses to start" in c.reason for c in plan.candidates_of("vllm"))


def test_argv_uses_current_flags_only() -> None:
    chosen = _glm_plan().chosen
    assert isinstance(chosen, vllm.VllmCandidate)
    argv = chosen.argv
    assert argv[:3] == ["vllm", "serve", "unsloth/GLM-4.7-Flash-NVFP4"]  # the checkpoint the plan chose
    assert "--swap-space" not in argv
    assert argv[argv.index("--tool-call-parser") + 1] == "glm47"
    assert argv[argv.index("--reasoning-parser") + 1] == "glm45"
    assert ("--enforce-eager" in argv) == chosen.flags.enforce_eager
    assert chosen.env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize(
    ("case_config", "reported_available_gib", "budget_gib", "flags"),
    [
        # vllm-08: Qwen3-8B-FP8 on a 23.53 GiB GPU at util 0.8 (vLLM ~0.10, graphs not reserved)
        ("Qwen3-8B.json", 8.60, 23.53, {"util": 0.8, "quant": "fp8", "len": 1024, "version": "0.10.2"}),
        # vllm-01: Qwen2.5-7B-AWQ on a 15.99 GiB RTX 4080 at util 0.9 (vLLM 0.26, graphs reserved)
        ("Qwen2.5-7B.json", 8.00, 15.99, {"util": 0.9, "quant": "awq", "len": 32768, "version": "0.26.0"}),
    ],
)
def test_available_kv_matches_published_logs_within_10_percent(
    case_config: str, reported_available_gib: float, budget_gib: float, flags: dict[str, object]
) -> None:
    facts = checkpoint_facts(
        json.loads((CONFIGS / case_config).read_text()), case_config, quantization=str(flags["quant"])
    )
    gpu = parse_gpu_spec(f"1x{budget_gib}GiB")[0]
    run = vllm.VllmFlags(1, float(flags["util"]), int(flags["len"]), 256, 2048)  # type: ignore[arg-type]
    checkpoint = vllm.Checkpoint(case_config, facts)
    memory = vllm.memory(checkpoint, gpu, run, str(flags["version"]), reported_total=int(budget_gib * GIB))
    assert abs(memory.kv_cache / GIB - reported_available_gib) / reported_available_gib < 0.10


def test_allowing_cpu_offload_pins_no_flag() -> None:
    """allow_cpu_offload widens the ladder; only real pins make vLLM try a plan that does not fit."""
    from gateway.backends.vllm.settings import VllmPins

    assert not VllmPins.from_policy(Policy(pins=Pins(engine={"allow_cpu_offload": True})))
    assert VllmPins.from_policy(Policy(pins=Pins(engine={"allow_cpu_offload": True}))).allow_cpu_offload
    assert VllmPins.from_policy(Policy(pins=Pins(engine={"max_num_seqs": 8}))) and VllmPins.from_policy(
        Policy(pins=Pins(context_length=4096))
    )
