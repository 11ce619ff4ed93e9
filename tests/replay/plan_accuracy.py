"""Published engine start-up logs replayed through the planner: predicted vs reported, term by term.

Shared by the unit tests (tests/unit/test_plan_accuracy.py) and the report that prints the full
table (``benchmarks/plan_accuracy.py``). Cases come from tests/data/memory-cases-dev.json.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.backends import llamacpp, vllm
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.model_facts import facts_from_config
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.memory import cuda_total
from gateway.core.devices import GIB, MIB, Device
from gateway.core.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

# id → replay inputs transcribed from the case (flags, gpu_model, notes)
REPLAY: dict[str, dict[str, Any]] = {
    "vllm-01": {"total_gib": 15.99, "util": 0.9, "tp": 1, "len": 32768, "quant": "awq", "version": "0.26.0"},
    "vllm-02": {"total_gib": 44.42, "util": 0.9, "tp": 4, "len": 32768, "quant": "fp8", "version": "0.10.2",
                "config": {"intermediate_size": 12288, "moe_intermediate_size": 1536},  # public Qwen3-235B config
                "excluded": "experts spread over 8 GPUs (DP2×TP4 with expert parallel); the planner shards "
                            "experts by TP only and never proposes EP, so its weights/GPU are 2× too high here "
                            "(halved: 27.5 vs 27.72 GiB reported)"},
    "vllm-03": {"total_gib": 44.42, "util": 0.9, "tp": 4, "len": 32768, "quant": None, "version": "0.10.2",
                "caveat": "L40S total taken from vllm-02 (44.42 GiB); version inferred from the era"},
    "vllm-08": {"total_gib": 23.53, "util": 0.8, "tp": 1, "len": 1024, "quant": "fp8", "version": "0.10.2"},
    "vllm-10": {"total_gib": 79.25, "util": 0.65, "tp": 1, "len": 131072, "quant": "mxfp4", "version": "0.19.0",
                "name": "A100", "caveat": "A100 80GB total taken as 79.25 GiB"},
}  # fmt: skip
# error cases: the KV one max-length request needs, which vLLM prints exactly
MAX_LEN_CASES = {
    "vllm-12": {"layers": 62, "kv_heads": 8, "head_dim": 128, "tp": 1},  # Qwen3-Coder-480B geometry (notes)
    "vllm-13": {"config": "configs/DeepSeek-V2-Lite.json", "tp": 1, "version": "0.8.3"},
}


@dataclass
class Row:
    case: str
    term: str
    predicted: float
    reported: float

    @property
    def error(self) -> float:
        return (self.predicted - self.reported) / self.reported if self.reported else 0.0


def _config(case: dict[str, Any]) -> dict[str, Any] | None:
    name = case.get("config_file")
    if not name:
        return None
    config = json.loads((DATA / name).read_text())
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads")
    return config if all(config.get(key) for key in needed) else None


def replay_vllm(case: dict[str, Any], inputs: dict[str, Any]) -> list[Row]:
    config = _config(case)
    assert config is not None
    facts = checkpoint_facts({**config, **inputs.get("config", {})}, case["model_id"], quantization=inputs["quant"])
    gpu = Device(0, inputs.get("name", "GPU"), int(inputs["total_gib"] * GIB), int(inputs["total_gib"] * GIB), (8, 9))
    tokens, seqs = vllm.batch_defaults(gpu)
    flags = vllm.VllmFlags(inputs["tp"], inputs["util"], inputs["len"], seqs, tokens)
    reported_total = int(inputs["total_gib"] * GIB)  # the CUDA total the log printed (NVML's is larger)
    m = vllm.memory(
        vllm.Checkpoint(case["model_id"], facts), gpu, flags, inputs["version"], reported_total=reported_total
    )
    reported = case["reported"]
    rows = [Row(case["id"], "verdict: starts (1) / refuses (0)", float(m.max_fitting_model_len >= inputs["len"]), 1.0)]
    for term, predicted, key in (
        ("weights/GPU GiB", m.weights / GIB, "weights_gib_breakdown"),
        ("weights/GPU GiB", m.weights / GIB, "model_loading_gib"),
        ("activation GiB", m.activation / GIB, "peak_activation_gib"),
        ("CUDA graphs GiB", m.cudagraph / GIB, "cudagraph_gib"),
        ("non-torch GiB", m.non_torch / GIB, "non_torch_gib"),
        ("available KV GiB", m.kv_cache / GIB, "available_kv_cache_gib"),
        ("KV tokens", m.kv_tokens, "gpu_kv_cache_tokens"),
    ):
        if isinstance(reported.get(key), int | float):
            rows.append(Row(case["id"], term, float(predicted), float(reported[key])))
    return rows


def replay_max_len(case: dict[str, Any], inputs: dict[str, Any]) -> list[Row]:
    error = case["reported"].get("error") or case["reported"].get("error_default_util")
    length = int(error["max_seq_len"])
    if "config" in inputs:
        facts = checkpoint_facts(json.loads((DATA / inputs["config"]).read_text()), case["model_id"])
        per_token = vllm.kv_bytes_per_token(facts, inputs["tp"], "auto", inputs["version"])
    else:
        per_token = inputs["layers"] * 2 * inputs["kv_heads"] * inputs["head_dim"] * 2
    refuses = per_token * length > error["available_gib"] * GIB
    rows = [Row(case["id"], "verdict: starts (1) / refuses (0)", float(not refuses), 0.0)]
    rows.append(
        Row(case["id"], f"KV for one {length:,}-token request GiB", per_token * length / GIB, error["needed_gib"])
    )
    if "estimated_max_len" in error:
        estimated = int(error["available_gib"] * GIB) // per_token
        rows.append(Row(case["id"], "estimated max length", estimated, error["estimated_max_len"]))
    return rows


# NVML totals of the named cards (MiB) whose CUDA-reported totals the cases or logs print
NVML_TOTALS = {
    "vllm-02": (46068, "total_memory_gib"),  # L40S
    "vllm-20": (81559, "total_gpu_memory_gib"),  # H100 80GB HBM3
}
SEED_003 = "logs/vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log"  # 2 × 16 GB (NVML 16303 MiB), cc 12.0


def replay_totals(cases: list[dict[str, Any]]) -> list[Row]:
    """The CUDA total vLLM budgets from, derived from NVML's, against what the logs printed."""
    rows = []
    for case in cases:
        if case["id"] in NVML_TOTALS:
            mib, key = NVML_TOTALS[case["id"]]
            gpu = Device(0, case["id"], mib * MIB, mib * MIB, (8, 9))
            rows.append(Row(case["id"], "CUDA total GiB", cuda_total(gpu) / GIB, float(case["reported"][key])))
    log = (DATA / SEED_003).read_text()
    found = re.search(r"total capacity of ([0-9.]+) GiB", log)
    if found:
        gpu = Device(0, "16 GB", 16303 * MIB, 16303 * MIB, (12, 0))
        rows.append(Row("seed-003", "CUDA total GiB", cuda_total(gpu) / GIB, float(found.group(1))))
    return rows


def replay_seed_003() -> list[Row]:
    """nvidia/Gemma-4-31B-IT-NVFP4, TP2 on 2 × 16 GB, vLLM 0.21.0 with the log's flags: it ran out of
    memory loading the weights (its hf_quant_config.json keeps self_attn, lm_head, vision in BF16)."""
    config = json.loads((DATA / "configs" / "gemma-4-31B-it.json").read_text())
    quant = json.loads((DATA / "configs" / "gemma-4-31B-it-nvfp4.hf_quant_config.json").read_text())
    facts = checkpoint_facts(config, "nvidia/Gemma-4-31B-IT-NVFP4", quant_file=quant)
    gpus = (
        Device(0, "16 GB", 16303 * MIB, 16303 * MIB, (12, 0)),
        Device(1, "16 GB", 16303 * MIB, 16303 * MIB, (12, 0)),
    )
    flags = vllm.VllmFlags(2, 0.9, 1024, 1, 1024, "fp8", language_model_only=True)
    candidate = vllm.evaluate(vllm.Checkpoint(facts.name, facts), gpus, flags, "0.21.0", Policy(min_context=1024))
    return [Row("seed-003", "verdict: starts (1) / refuses (0)", float(candidate.fits), 0.0)]


def replay_llamacpp() -> list[Row]:
    """KV sizes llama.cpp logged, from the geometry in the case notes."""
    rows = []
    for case_id, layers, kv_heads, n_ctx, reported_mib in (
        ("llama-01", 48, 4, 4096, 384),
        ("llama-03", 28, 8, 40960, 4480),
    ):
        config = {"hidden_size": 4096, "num_hidden_layers": layers, "num_attention_heads": 32}
        config |= {"num_key_value_heads": kv_heads, "head_dim": 128}
        facts = llamacpp.GgufFacts.from_config(facts_from_config(config, case_id), config)
        kv = sum(llamacpp.kv_layer_bytes(facts, i, "f16", n_ctx, NATIVE) for i in range(layers))
        rows.append(Row(case_id, "KV cache MiB", kv / MIB, reported_mib))
    qwen3_config = {"hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "vocab_size": 151936}
    qwen3_17b = llamacpp.GgufFacts.from_config(facts_from_config(qwen3_config, "qwen3-1.7b"), qwen3_config)
    compute = llamacpp.compute_buffer_bytes(
        qwen3_17b, 40960, flash_attention=True, holds_output=True, launcher=llamacpp.PYTHON
    )
    rows.append(Row("llama-03", "compute buffer MiB (output GPU)", compute / MIB, 300))
    return rows


def replay_all() -> tuple[list[Row], list[str], list[str], set[str]]:
    """(rows, caveats, skipped cases, excluded case ids)."""
    cases = json.loads((DATA / "memory-cases-dev.json").read_text())
    rows: list[Row] = []
    skipped: list[str] = []
    caveats: list[str] = []
    for case in cases:
        if case["id"] in REPLAY and _config(case) is not None:
            rows += replay_vllm(case, REPLAY[case["id"]])
            note = REPLAY[case["id"]].get("caveat") or REPLAY[case["id"]].get("excluded")
            if note:
                caveats.append(f"{case['id']}: {note}")
        elif case["id"] in MAX_LEN_CASES:
            rows += replay_max_len(case, MAX_LEN_CASES[case["id"]])
        elif case["engine"] == "vllm":
            why = "no usable config.json" if _config(case) is None else "GPU size or flags not stated"
            skipped.append(f"{case['id']} ({case['model_id']}): {why}")
    rows += replay_totals(cases) + replay_seed_003()
    rows += replay_llamacpp()
    excluded = {case_id for case_id, inputs in REPLAY.items() if "excluded" in inputs}
    return rows, caveats, skipped, excluded
