"""FP8 and NVFP4 checkpoints on GPUs without their tensor-core kernels (issue 29, part 3): vLLM loads
them (``get_min_capability`` 75) and runs them as Marlin weight-only kernels, W8A16 below 8.9
(csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu:145), W4A16 below 10.0
(csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu:71), as vLLM 0.32's sdist reads. The rung says so,
the speed estimate is priced for it, and no note speaks of native FP4 kernels there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.backends import vllm
from gateway.backends.vllm import weight_kernels
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.policy import Policy
from gateway.planning.catalog import builtin_catalog
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _qwen(quantization: dict[str, object]) -> CheckpointFacts:
    config = json.loads((CONFIGS / "Qwen3-8B.json").read_text())
    return checkpoint_facts({**config, "quantization_config": quantization}, "Qwen3-8B-quantized")


FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}


def _plan(facts: CheckpointFacts, spec: str, version: str = "0.32.0") -> Plan:
    engines = engine_plans(facts.name, checkpoints=[vllm.Checkpoint(facts.name, facts)], vllm_version=version)
    inventory = Inventory(parse_gpu_spec(spec), 64 * GIB, 64 * GIB, source="simulated")
    return evaluate_and_choose(facts.name, engines, inventory, Policy(min_context=32768))


@pytest.mark.parametrize(
    ("quantization", "spec", "scheme"),
    [
        (FP8, "1x24GiB@8.6", "W8A16"),  # RTX 3090: no FP8 tensor cores
        (FP8, "1x24GiB@8.9", ""),  # RTX 4090: CUTLASS FP8
        (NVFP4, "1x24GiB@8.6", "W4A16"),
        (NVFP4, "1x24GiB@8.9", "W4A16"),  # Ada has FP8 but no FP4 tensor cores
        (NVFP4, "1x32GiB@12.0", ""),  # RTX 5090: CUTLASS FP4
    ],
)
def test_the_rung_says_when_fp8_or_nvfp4_runs_as_marlin(
    quantization: dict[str, object], spec: str, scheme: str
) -> None:
    plan = _plan(_qwen(quantization), spec)
    chosen = plan.chosen
    assert isinstance(chosen, vllm.VllmCandidate) and chosen.fits, plan.decision_reason
    assert chosen.weight_kernel == scheme
    assert (f"as {scheme} Marlin" in chosen.reason) == bool(scheme), chosen.reason
    assert chosen.to_json()["weight_kernel"] == (f"{scheme} Marlin" if scheme else None)
    marlin_notes = [n for n in plan.notes if "Marlin weight-only kernels" in n]
    assert bool(marlin_notes) == bool(scheme), plan.notes
    if scheme:
        assert "scaled_mm_entry.cu:" in marlin_notes[0]


def test_the_speed_estimate_is_priced_for_marlin() -> None:
    """The same FP8 checkpoint decodes at the native kernels' estimate on 8.9 and at the Marlin
    share of it on 8.6; NVFP4 keeps its native price only from 10.0."""
    fp8, nvfp4 = _qwen(FP8), _qwen(NVFP4)
    assert weight_kernels.decode_share(fp8, (8, 9)) == 1.0
    assert weight_kernels.decode_share(fp8, (8, 6)) == weight_kernels.DECODE_SHARE["W8A16"] < 1.0
    assert weight_kernels.decode_share(nvfp4, (8, 9)) == weight_kernels.DECODE_SHARE["W4A16"] < 1.0
    assert weight_kernels.decode_share(nvfp4, (12, 0)) == 1.0
    assert weight_kernels.decode_share(_qwen({"quant_method": "awq", "bits": 4}), (8, 6)) == 1.0


def test_the_cutlass_fp4_moe_note_is_not_given_on_ampere() -> None:
    """GLM-4.7-Flash's NVFP4 checkpoint before vLLM 0.24: the note about CUTLASS FP4 MoE and 0.24's
    faster SM12x path belongs to GPUs with FP4 tensor cores; on RTX 3090s it runs as W4A16 Marlin."""
    checkpoints = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints
    engines = engine_plans("glm-4.7-flash", checkpoints=checkpoints, vllm_version="0.21.0")
    ampere = evaluate_and_choose(
        "glm-4.7-flash", engines, Inventory(parse_gpu_spec("2x24GiB@8.6"), 64 * GIB, 64 * GIB), Policy()
    )
    assert not any("CUTLASS FP4 MoE" in note for note in ampere.notes), ampere.notes
    assert any("NVFP4 runs as W4A16 Marlin" in note for note in ampere.notes), ampere.notes
    engines = engine_plans("glm-4.7-flash", checkpoints=checkpoints, vllm_version="0.21.0")
    blackwell = evaluate_and_choose(
        "glm-4.7-flash", engines, Inventory(parse_gpu_spec("2x32GiB@12.0"), 64 * GIB, 64 * GIB), Policy()
    )
    assert any("CUTLASS FP4 MoE" in note for note in blackwell.notes), blackwell.notes


@pytest.mark.parametrize(("quantization", "spec", "share"), [(FP8, "1x24GiB@8.6", 0.8), (FP8, "1x24GiB@8.9", 1.0)])
def test_the_chosen_rung_decodes_at_the_marlin_share_of_the_native_estimate(
    quantization: dict[str, object], spec: str, share: float
) -> None:
    """The share reaches the rung the plan ranks and prints, not only the helper that names it."""
    from gateway.backends.vllm.estimate import decode_tokens_per_s

    facts = _qwen(quantization)
    chosen = _plan(facts, spec).chosen
    assert isinstance(chosen, vllm.VllmCandidate) and chosen.fits
    native = decode_tokens_per_s(facts, chosen.memory, chosen.flags, parse_gpu_spec(spec)[0])
    assert chosen.tokens_per_s == pytest.approx(native * share)
    assert weight_kernels.DECODE_SHARE.get(chosen.weight_kernel, 1.0) == share
