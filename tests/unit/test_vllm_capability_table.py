"""Capability × release × quantization × KV dtype → verdict, on every compute capability from 7.5
to 12.0 (issue 22).

The expected verdicts are the rules as read from vLLM's source by hand (each stated below with its
file); the test checks that (1) the tables extracted from the sdists give the same verdict and
cite a line of that release's source, and (2) `gateway plan`'s ladder agrees row by row: it
starts what vLLM runs and refuses, citing the same line, what vLLM refuses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import vllm
from gateway.backends.vllm import releases
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts
from gateway.backends.vllm.release_table import table_for, versions
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.policy import Pins, Policy
from gateway.planning.planner import evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
CAPABILITIES = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
RELEASES = ("0.14.0", "0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.21.0", "0.24.0", "0.32.0", "0.33.0")
CITATION = re.compile(r"vllm/[\w/]+\.py:\d+")

# quantization_config as the checkpoints carry it
QUANTIZATIONS: dict[str, dict[str, Any] | None] = {
    "bf16": None,
    "modelopt-nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    "modelopt-fp8": {"quant_method": "modelopt", "quant_algo": "FP8"},
    "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "ct-nvfp4": {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
    },
    "ct-fp8": {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
    },
}


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def expected_quantization(release: str, quant: str, capability: tuple[int, int]) -> bool:
    """``get_min_capability`` of the class vLLM picks (model_executor/layers/quantization/):
    ModelOptNvFp4Config 75 and Fp8Config 75 in every release read (Marlin below their native
    kernels); ModelOptFp8Config 89 up to 0.24, 80 in 0.32 and 0.33; compressed-tensors falls back
    from W4A4 NVFP4 (cutlass, 100 in 0.14) to W4A16 NVFP4 and from W8A8 FP8 (89) to W8A16 FP8 via
    Marlin, both 80 in 0.14 and 75 from 0.16."""
    have = capability[0] * 10 + capability[1]
    need = {
        "bf16": 0,
        "modelopt-nvfp4": 75,
        "fp8": 75,
        "modelopt-fp8": 89 if _v(release) < (0, 32) else 80,
        "ct-nvfp4": 80 if _v(release) < (0, 16) else 75,
        "ct-fp8": 80 if _v(release) < (0, 16) else 75,
    }[quant]
    return have >= need


def expected_fp8_kv(release: str, mla: bool, capability: tuple[int, int]) -> bool:
    """platforms/cuda.py ``_get_backend_priorities`` and each backend's capability check and
    ``supported_kv_cache_dtypes``: MLA on 9.x (FLASHMLA) and 10.x (CUTLASS_MLA / FLASHINFER_MLA)
    takes fp8 in every release; elsewhere only TRITON_MLA runs, with fp8 from 0.18. Without MLA
    FLASHINFER (7.5–12.1; 8.0+ from 0.24) or TRITON_ATTN (any) takes fp8 everywhere."""
    if not mla:
        return True
    return capability[0] in (9, 10) or _v(release) >= (0, 18)


def _facts(model: str, quant: str) -> CheckpointFacts:
    config = json.loads((CONFIGS / f"{model}.json").read_text())
    quantization = QUANTIZATIONS[quant]
    if quantization is not None:
        config = {**config, "quantization_config": quantization}
    return checkpoint_facts(config, f"{model}-{quant}")


def _plan_row(facts: CheckpointFacts, capability: tuple[int, int], release: str, kv: str) -> vllm.VllmCandidate:
    """The one pinned rung `gateway plan` evaluates on an 80 GiB card of this capability."""
    spec = f"1x80GiB@{capability[0]}.{capability[1]}"
    inventory = Inventory(parse_gpu_spec(spec), 64 * GIB, 64 * GIB, source="simulated")
    pins = Pins(
        context_length=4096,
        engine={
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": 0.9,
            "max_num_seqs": 1,
            "enforce_eager": True,
            "kv_cache_dtype": kv,
        },
    )
    engines = engine_plans(facts.name, checkpoints=[vllm.Checkpoint(facts.name, facts)], vllm_version=release)
    plan = evaluate_and_choose(facts.name, engines, inventory, Policy(min_context=4096, pins=pins))
    (candidate,) = plan.candidates_of("vllm")
    assert isinstance(candidate, vllm.VllmCandidate)
    return candidate


def test_every_release_in_the_table_test_has_an_extracted_table() -> None:
    assert set(RELEASES) <= set(versions())
    assert not any(v.startswith("0.15") for v in versions())  # wheels only on PyPI: nothing read


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("quant", list(QUANTIZATIONS))
@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("model", ["DeepSeek-V2-Lite", "Qwen3-8B"])
def test_verdict_table(release: str, quant: str, kv: str, model: str) -> None:
    facts = _facts(model, quant)
    mla = releases.uses_mla(facts, release)
    assert mla == (model == "DeepSeek-V2-Lite")  # deepseek_v2 is in every release's MLA list
    table = table_for(release)
    assert table.exact
    for capability in CAPABILITIES:
        row = f"{release} cc {capability[0]}.{capability[1]} {model} {quant} KV {kv}"
        quant_ok = expected_quantization(release, quant, capability)
        kv_ok = kv == "auto" or expected_fp8_kv(release, mla, capability)
        # (1) the extracted table, with the line it rests on
        quant_verdict = table.quantization_verdict(facts, capability)
        if quant != "bf16":
            assert quant_verdict is not None and quant_verdict.ok == quant_ok, row
            assert CITATION.fullmatch(quant_verdict.source), row
        kv_verdict = table.attention_backend(facts, capability, kv)
        assert kv_verdict.ok == kv_ok, f"{row}: {kv_verdict.reason}"
        assert CITATION.fullmatch(kv_verdict.source), row
        # (2) the plan
        candidate = _plan_row(facts, capability, release, kv)
        assert candidate.startable == (quant_ok and kv_ok), f"{row}: {candidate.reason}"
        if not quant_ok:
            assert quant_verdict is not None and f"[{quant_verdict.source}]" in candidate.reason, row
            assert not candidate.argv
        elif not kv_ok:
            assert kv_verdict.source in candidate.reason and "--kv-cache-dtype fp8" in candidate.reason, row
            assert not candidate.argv
        else:
            assert candidate.fits and candidate.argv, f"{row}: {candidate.reason}"
            assert ("--kv-cache-dtype" in candidate.argv) == (kv == "fp8")


def test_the_mla_list_follows_each_release_including_033s_lower_case_axk1() -> None:
    """transformers_utils/model_arch_config_convertor.py ``is_deepseek_mla``: 0.17.0 spells "AXK1",
    0.32.0 and 0.33.0 "axk1" (a model_type compared exactly); 0.32 adds nine more types."""
    assert "AXK1" in table_for("0.17.0").mla_types() and "axk1" not in table_for("0.17.0").mla_types()
    newest = set(table_for("0.33.0").mla_types())
    assert "axk1" in newest and "AXK1" not in newest
    added = newest - set(table_for("0.24.0").mla_types())
    assert len(added - {"axk1"}) == 9, sorted(added)
    config = json.loads((CONFIGS / "DeepSeek-V2-Lite.json").read_text())
    for model_type in sorted(added):
        facts = checkpoint_facts({**config, "model_type": model_type}, model_type)
        per_token = vllm.kv_bytes_per_token(facts, 1, "auto", "0.33.0")
        assert per_token == facts.num_layers * 576 * 2, model_type  # the latent, not 16 full heads
        assert vllm.kv_bytes_per_token(facts, 1, "auto", "0.24.0") > 10 * per_token


def test_default_utilization_per_release() -> None:
    """config/cache.py ``gpu_memory_utilization: float = Field(default=...)``: 0.9 up to 0.19, 0.92 from 0.21."""
    for release in RELEASES:
        table = table_for(release)
        assert table.default_utilization == (0.9 if _v(release) < (0, 21) else 0.92), release
        assert table.default_utilization_source.startswith("vllm/config/cache.py:")


@pytest.mark.parametrize(("release", "line"), [("0.17.0", 156), ("0.21.0", 191), ("0.32.0", 433), ("0.33.0", 438)])
def test_fp8_kv_on_hopper_runs_on_flashattention_3_as_the_release_picks_it(release: str, line: int) -> None:
    """FlashAttentionBackend.supports_kv_cache_dtype takes fp8 where get_flash_attn_version gives FA3
    and the GPU is 9.x (0.17 flash_attn.py:156–160; 0.32 :433 → fa_utils.py flash_attn_supports_kv_cache_dtype),
    and FLASH_ATTN comes first on 9.0: an H100 plan names it, not FlashInfer. Elsewhere (8.x, 12.x: FA2)
    fp8 KV still goes to FlashInfer."""
    facts = _facts("Qwen3-8B", "bf16")
    table = table_for(release)
    hopper = table.attention_backend(facts, (9, 0), "fp8")
    assert hopper.ok and hopper.reason.startswith("FLASH_ATTN (attention backend, FA3"), hopper.reason
    assert hopper.source == f"vllm/v1/attention/backends/flash_attn.py:{line}"
    for capability in ((8, 6), (8, 9), (12, 0)):
        other = table.attention_backend(facts, capability, "fp8")
        assert other.ok and other.reason.startswith("FLASHINFER"), (capability, other.reason)


def test_the_h100_plan_notes_flashattention_for_its_fp8_kv() -> None:
    facts = _facts("Qwen3-8B", "bf16")
    engines = engine_plans(facts.name, checkpoints=[vllm.Checkpoint(facts.name, facts)], vllm_version="0.32.0")
    inventory = Inventory(parse_gpu_spec("1x80GiB@9.0"), 64 * GIB, 64 * GIB, source="simulated")
    pins = Pins(context_length=4096, engine={"kv_cache_dtype": "fp8", "tensor_parallel_size": 1})
    plan = evaluate_and_choose(facts.name, engines, inventory, Policy(min_context=4096, pins=pins))
    notes = [n for n in plan.notes if "fp8 KV runs on" in n]
    assert notes and "FLASH_ATTN (attention backend, FA3)" in notes[0], plan.notes


@pytest.mark.parametrize(
    ("capability", "backend"),
    [((8, 6), "TRITON_ATTN"), ((8, 9), "TRITON_ATTN"), ((9, 0), "FLASH_ATTN"), ((12, 0), "TRITON_ATTN")],
)
@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_gemma4_head_size_512_gets_the_backend_its_config_hook_sets(
    capability: tuple[int, int], backend: str, kv: str
) -> None:
    """Gemma 4's full layers have 512-wide heads, its sliding ones 256. vLLM 0.32's Gemma4Config
    (models/config.py:229) keeps FlashAttention at FA4 on every layer where FA4 runs (9.x: its
    supports_head_size takes 512 only with FA4), else forces TRITON_ATTN; FA2 (8.x, 12.x) takes no 512."""
    config = json.loads((CONFIGS / "gemma-4-31B-it.json").read_text())
    facts = checkpoint_facts(config, "gemma-4-31B-it")
    assert (facts.head_dim, facts.global_head_dim) == (256, 512)
    verdict = table_for("0.32.0").attention_backend(facts, capability, kv)
    assert verdict.ok and verdict.reason.startswith(backend), verdict.reason
    if backend == "FLASH_ATTN":
        assert "FA4" in verdict.reason
    else:
        assert "vllm/model_executor/models/config.py:229" in verdict.reason
