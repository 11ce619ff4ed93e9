"""Engine plans from facts held in memory, for planner tests that read no files."""

from __future__ import annotations

from typing import Any

from gateway.backends import llamacpp, vllm
from gateway.backends.base import Installation
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.launcher import PYTHON, Launcher
from gateway.planning.planner import EnginePlan


def engine_plans(
    name: str,
    *,
    checkpoints: list[vllm.Checkpoint] | None = None,
    gguf_facts: GgufFacts | None = None,
    gguf: str = "model.gguf",
    chat_format: str | None = None,
    vllm_version: str = vllm.DEFAULT_VERSION,
    launcher: Launcher = PYTHON,
    parsers: tuple[str | None, str | None] = (None, None),
) -> list[EnginePlan]:
    """Both engines, as the registry orders them; an engine without facts has no model (not planned)."""
    vllm_model = vllm.VllmModel(name, list(checkpoints), *parsers) if checkpoints else None
    source = llamacpp.LlamaCppSource(gguf_path=gguf, chat_format=chat_format)
    llama_model = llamacpp.LlamaCppModel(name, source, gguf_facts, gguf) if gguf_facts else None
    return [
        EnginePlan(vllm.BACKEND, Installation(None, vllm_version, "given"), vllm_model),
        EnginePlan(
            llamacpp.BACKEND, Installation(("python",), "0.3.36", "llama-cpp-python", launcher.name), llama_model
        ),
    ]


# ---------------------------------------------------------------------------------------------
# The plan's objective restated from its JSON alone, so a test can tell when the ranking breaks
# (gateway/backends/objective.py is the code; this is the README's order, written again independently).
# ---------------------------------------------------------------------------------------------

ACCEPTABLE_TOKENS_PER_S = 10.0
VLLM_BITS = {None: 16.0, "fp8": 8.0, "mxfp8": 8.0, "int8": 7.5, "nvfp4": 4.5, "mxfp4": 4.5}
# MXFP4: gpt-oss's own format (the only MXFP4 GGUF in the test hub), full precision (issue 42)
GGUF_BITS = {
    "MXFP4": 16.0,
    "Q2_K": 3.35,
    "Q3_K_M": 3.91,
    "Q4_K_M": 4.85,
    "Q5_K_M": 5.69,
    "Q6_K": 6.56,
    "Q8_0": 8.5,
    "BF16": 16.0,
}


def _cold(c: dict[str, Any]) -> bool:
    """A later turn prefills at least 1,024 tokens of the previous prompt again (issue 42)."""
    return int((c.get("warm_turn") or {}).get("tokens", 0)) >= 1024


def vllm_standing(c: dict[str, Any], policy: dict[str, Any], default_util: float) -> tuple[Any, ...]:
    """A fitting vLLM candidate's place in the objective, before speed (lower is better)."""
    context = c["context_length"]
    return (
        context < policy["min_context"],
        c["cpu_offload_gb"] > 0,
        c["gpu_memory_utilization"] > default_util,
        c["enforce_eager"],
        c["max_num_seqs"] < 4,
        _cold(c),
        -(min(context, policy["target_context"]) // 8192),
        -VLLM_BITS.get(c["quantization"], 4.25),
        c["kv_cache_dtype"] != "auto",
    )


def gguf_standing(row: dict[str, Any], policy: dict[str, Any], has_gpus: bool) -> tuple[Any, ...]:
    """A fitting GGUF quantization's place (its best placement, from the alternatives table)."""
    speed = row["tokens_per_s_estimate"] or 0.0
    # the file's real bits per weight (issue 42): its tensor table's bytes over its weights, as the plan read
    # them; the name's figure where the plan has none (a header not read)
    bits = row.get("bits_per_weight") or GGUF_BITS.get(row["quant"], 4.25)
    return (
        row["n_ctx"] < policy["min_context"],
        has_gpus and row["layers_on_gpu"] < row["layers"],
        bits < 4,
        row.get("warm_turn_tokens", 0) >= 1024,
        -(min(row["n_ctx"], policy["target_context"]) // 8192),
        round(ACCEPTABLE_TOKENS_PER_S - speed, 1) if 0 < speed < ACCEPTABLE_TOKENS_PER_S else 0.0,
        -bits,
        row["kv_type"] == "q8_0",  # less precise KV: taken for context, not for its decode estimate
        -round(speed, 1),
    )


def objective_broken(data: dict[str, Any], default_util: float) -> str | None:
    """Why the plan's decision is not the objective's (None: it is): vLLM only where it meets the
    floor without offload; within the chosen engine nothing ranks before the chosen."""
    decision = data["decision"]
    if decision["candidate"] is None:
        return None
    policy, candidates = data["policy"], data["candidates"]
    chosen = candidates[decision["candidate"]]
    vllm = [c for c in candidates if c["backend"] == "vllm" and c["fits"] and "nodes" not in c]
    steady = [c for c in vllm if c["context_length"] >= policy["min_context"] and not c["cpu_offload_gb"]]
    if decision["backend"] == "vllm":
        mine = vllm_standing(chosen, policy, default_util)
        better = [c for c in vllm if vllm_standing(c, policy, default_util) < mine]
        if better:
            return f"vLLM {better[0]['rung']} ({better[0]['checkpoint']}) ranks before the chosen {chosen['rung']}"
        return None
    if steady and not (all(_cold(c) for c in steady) and not _cold(chosen)):
        return f"llama.cpp chosen though vLLM {steady[0]['rung']} meets the floor without offload"
    table = chosen.get("gguf_alternatives") or []
    has_gpus = any(d["kind"] == "gpu" for d in data["inventory"]["devices"])
    picked = [row for row in table if row["chosen"]]
    fitting = [row for row in table if row["fits"]]
    if picked and fitting:
        mine = gguf_standing(picked[0], policy, has_gpus)
        better = [row for row in fitting if gguf_standing(row, policy, has_gpus) < mine]
        if better:
            return f"GGUF {better[0]['quant']} ranks before the chosen {picked[0]['quant']}"
    return None
