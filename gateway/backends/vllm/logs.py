"""Reading vLLM's log: failure lines with the engine's own numbers, and what to try next."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from gateway.backends.base import Failure, FailureKind, first_failure
from gateway.backends.vllm.memory import CUDA_CONTEXT_BYTES, VllmFlags
from gateway.core.devices import GIB

_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_FAILURES: list[tuple[re.Pattern[str], FailureKind, str]] = [
    (
        re.compile(r"estimated maximum model length is " + _NUMBER),
        FailureKind.KV_TOO_SMALL,
        "lower --max-model-len to the engine's estimate, or give the KV cache more memory",
    ),
    (
        re.compile(r"Failed to load model - not enough GPU memory|CUDA out of memory\. Tried to allocate"),
        FailureKind.WEIGHTS_OOM,
        "the weights do not fit: more tensor parallelism, a quantized checkpoint, or --cpu-offload-gb",
    ),
    (
        re.compile(r"No available memory for the cache blocks"),
        FailureKind.NO_KV_MEMORY,
        "raise --gpu-memory-utilization, use --enforce-eager, or fewer --max-num-seqs",
    ),
    (
        re.compile(
            r"(?:Free|Available) memory on (?:device|node \d+) \("
            + _NUMBER
            + r"/"
            + _NUMBER
            + r" GiB\) on startup is less than desired"
        ),
        FailureKind.FREE_BELOW_UTILIZATION,
        "lower --gpu-memory-utilization to what is free, or stop what else uses the memory",
    ),
    (
        re.compile(
            r"Available memory on node \d+ \("
            + _NUMBER
            + r"/"
            + _NUMBER
            + r" GiB\) on kv cache allocation is less than requested memory for kv \("
            + _NUMBER
        ),
        FailureKind.KV_EXCEEDS_FREE,
        "decrease --kv-cache-memory-bytes to what is free",
    ),
    (
        re.compile(r"User-specified max_model_len \(" + _NUMBER + r"\) is greater than the derived max_model_len"),
        FailureKind.MAX_LEN_OVER_LIMIT,
        "pass --max-model-len no larger than the model's max_position_embeddings",
    ),
    (
        re.compile(r"invalid (?:tool call|reasoning) parser|unrecognized arguments|error: argument"),
        FailureKind.BAD_ARGUMENT,
        "fix the parser name or flag in the catalog entry (vLLM lists the valid ones in this line)",
    ),
    (
        re.compile(r"EngineCore failed to start|WorkerProc failed to start|Engine core initialization failed"),
        FailureKind.ENGINE_FAILED,
        "see the engine log above this line",
    ),
]


_NUMBER_NAMES = {
    FailureKind.KV_TOO_SMALL: ("estimated_max_len",),
    FailureKind.FREE_BELOW_UTILIZATION: ("free_gib", "total_gib"),
    FailureKind.KV_EXCEEDS_FREE: ("free_gib", "total_gib", "requested_gib"),
    FailureKind.MAX_LEN_OVER_LIMIT: ("requested_len",),
}


def classify(line: str) -> Failure | None:
    """The failure this vLLM log line proves, with the numbers it printed."""
    return first_failure(_FAILURES, line, _NUMBER_NAMES)


def adjust(
    flags: VllmFlags, failure: Failure, *, min_context: int, pinned: frozenset[str] = frozenset()
) -> VllmFlags | None:
    """The next attempt the engine's own numbers allow, or None to move down the ladder.

    Pinned flags stay as the user gave them, except that a length or a share the engine has just
    proven impossible is lowered to what the engine says fits (never below the minimum context).
    """
    numbers = failure.numbers
    if failure.kind is FailureKind.KV_TOO_SMALL and "estimated_max_len" in numbers:
        length = int(numbers["estimated_max_len"])
        if length >= min_context and length < flags.max_model_len:
            return replace(flags, max_model_len=length)
    if failure.kind is FailureKind.FREE_BELOW_UTILIZATION and numbers.get("total_gib"):
        share = math.floor((numbers["free_gib"] - CUDA_CONTEXT_BYTES / GIB) / numbers["total_gib"] * 100) / 100
        if 0.1 <= share < flags.gpu_memory_utilization and flags.kv_cache_memory_bytes is None:
            return replace(flags, gpu_memory_utilization=share)
    if failure.kind is FailureKind.NO_KV_MEMORY and "enforce_eager" not in pinned and not flags.enforce_eager:
        return replace(flags, enforce_eager=True)
    return None
