"""Issue 22, items 3, 7, 8 and speculative decoding: quantization read exactly, MTP layers, the
release's default utilization behind a pinned KV size, and the utilization ceiling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gateway.backends import vllm
from gateway.backends.vllm import releases
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.ladder import MAX_UTILIZATION
from gateway.core.devices import GIB, MIB, Inventory, parse_gpu_spec
from gateway.core.policy import Pins, Policy
from gateway.planning.catalog import builtin_catalog
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
RTX_5090_PAIR = "2x32607MiB@12.0"


def _qwen(quantization: dict[str, object] | None) -> dict[str, object]:
    config = json.loads((CONFIGS / "Qwen3-8B.json").read_text())
    return {**config, "quantization_config": quantization} if quantization else config


def _plan(checkpoints: list[vllm.Checkpoint], spec: str, version: str, pins: Pins | None = None) -> Plan:
    engines = engine_plans("m", checkpoints=checkpoints, vllm_version=version)
    inventory = Inventory(parse_gpu_spec(spec), 64 * GIB, 64 * GIB, source="simulated")
    return evaluate_and_choose(
        "m", engines, inventory, Policy(min_context=(pins and pins.context_length) or 32768, pins=pins or Pins())
    )


def _glm() -> list[vllm.Checkpoint]:
    return vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints


# Item 3 ---------------------------------------------------------------------------------------


def test_modelopt_fp8_is_read_as_fp8_at_about_one_byte_per_weight() -> None:
    """quant_method "modelopt" is ModelOptFp8Config (quant_algo FP8), not NVFP4."""
    fp8 = checkpoint_facts(_qwen({"quant_method": "modelopt", "quant_algo": "FP8"}), "fp8")
    nvfp4 = checkpoint_facts(_qwen({"quant_method": "modelopt", "quant_algo": "NVFP4"}), "nvfp4")
    nested = checkpoint_facts(_qwen({"quant_method": "modelopt", "quantization": {"quant_algo": "fp8"}}), "n")
    bf16 = checkpoint_facts(_qwen(None), "bf16")
    assert (fp8.quantization, nvfp4.quantization, nested.quantization) == ("fp8", "nvfp4", "fp8")
    assert fp8.quant_method == "modelopt" and fp8.quant_algo == "FP8"
    assert 0.5 < fp8.weight_bytes / bf16.weight_bytes < 0.6  # ~1 byte per linear weight, embeddings in 16 bits
    assert fp8.weight_bytes > 1.4 * nvfp4.weight_bytes  # was taken for NVFP4 before


def test_compressed_tensors_schemes_are_read_from_the_weights() -> None:
    def scheme(bits: int, kind: str, group: int | None = None) -> str | None:
        weights = {"num_bits": bits, "type": kind, **({"group_size": group} if group else {})}
        config = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": weights}}}
        return checkpoint_facts(_qwen(config), "ct").quantization

    assert scheme(4, "float", 16) == "nvfp4"
    assert scheme(4, "float", 32) == "mxfp4"
    assert scheme(8, "float") == "fp8"
    assert scheme(8, "int") == "int8"
    assert scheme(4, "int", 128) == "int4"  # W4A16: was read as int8 before


def test_modelopt_fp8_needs_8_9_until_0_24_and_8_0_from_0_32() -> None:
    facts = checkpoint_facts(_qwen({"quant_method": "modelopt", "quant_algo": "FP8"}), "fp8")
    ampere = _plan([vllm.Checkpoint("fp8", facts)], "1x80GiB@8.0", "0.24.0")
    refused = ampere.candidates_of("vllm")
    assert refused and not any(c.startable for c in refused)
    assert "fp8 needs compute capability 8.9+ (ModelOptFp8Config.get_min_capability" in refused[0].reason
    later = _plan([vllm.Checkpoint("fp8", facts)], "1x80GiB@8.0", "0.32.0")
    assert any(c.fits for c in later.candidates_of("vllm"))


# Item 7 and speculative decoding ------------------------------------------------------------------


def test_mtp_layers_are_not_weights_unless_speculative_decoding_loads_them() -> None:
    """GLM-4.7-Flash's num_nextn_predict_layers 1: in the checkpoint's bytes (catalog or
    safetensors), skipped by vLLM's loader without --speculative-config."""
    estimated = _glm()[0].facts
    assert estimated.mtp_layers == 1 and 0.9 * GIB < estimated.mtp_bytes < 1.5 * GIB
    measured = dataclasses.replace(
        estimated, weight_bytes=estimated.weight_bytes + estimated.mtp_bytes, weight_bytes_source="safetensors index"
    )
    flags = vllm.VllmFlags(2, 0.92, 32768, 8, 2048)
    gpu = parse_gpu_spec(RTX_5090_PAIR)[0]
    off = vllm.memory(vllm.Checkpoint("a", estimated), gpu, flags, "0.32.0")
    off_measured = vllm.memory(vllm.Checkpoint("b", measured), gpu, flags, "0.32.0")
    assert off.weights == off_measured.weights  # the MTP layer of the safetensors is not counted
    on = vllm.memory(vllm.Checkpoint("a", estimated), gpu, dataclasses.replace(flags, speculative_mtp=1), "0.32.0")
    assert on.weights - off.weights == estimated.mtp_bytes // 2 == on.mtp_weights  # ≈ 0.5–0.6 GiB per GPU at TP2
    assert on.kv_bytes_per_token == off.kv_bytes_per_token * 48 // 47  # the MTP layer caches its KV too


def test_mtp_is_a_rung_where_the_release_drafts_with_the_models_own_layers() -> None:
    """0.16.0+ config/speculative.py hf_config_override renames Glm4MoeLiteForCausalLM to
    glm4_moe_lite_mtp (in MTPModelTypes); 0.14.0 has no such rename (and no GLM-4.7-Flash)."""
    facts = _glm()[0].facts
    assert releases.mtp_draft(facts, "0.16.0") == "glm4_moe_lite_mtp"
    assert releases.mtp_draft(facts, "0.14.0") is None
    qwen = checkpoint_facts(_qwen(None), "q")
    assert releases.mtp_draft(qwen, "0.33.0") is None  # no MTP layers: no rung
    plan = _plan(_glm(), RTX_5090_PAIR, "0.32.0")
    bf16 = [c for c in plan.candidates_of("vllm") if c.checkpoint.quantization is None and c.fits]
    assert not vllm.ranked(bf16)[0].flags.speculative_mtp  # BF16 + MTP (~0.6 GiB/GPU more) needs fp8 KV
    # with auto KV, BF16 + MTP stays below the 65,536 floor: a last resort at most
    assert all(c.flags.kv_cache_dtype == "fp8" or c.traits.below_floor for c in bf16 if c.flags.speculative_mtp)
    nvfp4 = vllm.ranked([c for c in plan.candidates_of("vllm") if c.checkpoint.quantization == "nvfp4"])
    best = nvfp4[0]
    assert best.flags.speculative_mtp == 1 and best.argv
    argv = best.argv
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 1}
    assert "MTP speculative decoding" in best.reason and "glm4_moe_lite_mtp" in best.reason
    plain = [c for c in nvfp4 if not c.flags.speculative_mtp]
    assert plain and all(c.concessions.no_mtp == 1 for c in plain)
    assert best.memory.kv_bytes_per_token > plain[0].memory.kv_bytes_per_token  # its KV term is counted
    older = _plan(_glm(), RTX_5090_PAIR, "0.14.0")
    assert not any(c.flags.speculative_mtp for c in older.candidates_of("vllm"))


# Item 8 -----------------------------------------------------------------------------------------


def test_a_pinned_kv_size_is_checked_against_the_releases_default_utilization() -> None:
    """Without --gpu-memory-utilization vLLM requests CacheConfig's default share: 0.9 in 0.19,
    0.92 in 0.21. 28.9 GiB free of a 31.36 GiB card passes the first and fails the second."""
    facts = checkpoint_facts(_qwen(None), "q")
    pins = Pins(
        context_length=8192, engine={"tensor_parallel_size": 1, "kv_cache_memory_bytes": 4 * GIB, "max_num_seqs": 4}
    )
    spec = f"1x32607MiB@8.9:free={int(28.9 * 1024 + (32607 * MIB - 31.36 * GIB) / MIB)}MiB"
    old = _plan([vllm.Checkpoint("q", facts)], spec, "0.19.0", pins).candidates_of("vllm")
    new = _plan([vllm.Checkpoint("q", facts)], spec, "0.21.0", pins).candidates_of("vllm")
    assert {c.flags.gpu_memory_utilization for c in old} == {0.9} and any(c.fits for c in old)
    assert {c.flags.gpu_memory_utilization for c in new} == {0.92} and not any(c.fits for c in new)
    assert "util 0.92" in new[0].reason and "vLLM refuses to start" in new[0].reason


def test_the_utilization_ceiling_on_a_32_gb_card_keeps_the_context_the_logs_show() -> None:
    """0.98 of 31.36 GiB leaves 0.63 GiB against the 0.45–0.60 GiB in use before vLLM's snapshot
    in the recorded start-ups: the ladder stops at 0.97 there (0.94 GiB), at 0.98 on an 80 GB card."""
    plan = _plan(_glm()[:1], RTX_5090_PAIR, "0.32.0")
    utils = {c.flags.gpu_memory_utilization for c in plan.candidates_of("vllm") if c.startable}
    assert max(utils) == 0.97 < MAX_UTILIZATION
    big = _plan(_glm()[:1], "2x80GiB@9.0", "0.32.0")
    assert max(c.flags.gpu_memory_utilization for c in big.candidates_of("vllm") if c.startable) == MAX_UTILIZATION
