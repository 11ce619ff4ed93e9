"""What each vLLM release can load and how it runs it, as its own source says: the gates read the
per-release tables (gateway/backends/vllm/release_table.py, extracted from the sdists by
scripts/vllm_release_table.py), so every refusal cites the release's file and line.

A plan for a release that cannot load the architecture or the quantization, or has no attention
backend for the KV dtype on these GPUs, says so and prints no command.
"""

from __future__ import annotations

from functools import lru_cache

from packaging.version import InvalidVersion, Version

from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.release_table import Verdict, first_registering, next_read, table_for, versions
from gateway.backends.vllm.weight_kernels import weight_only

DEFAULT_VERSION = "0.32.0"  # assumed when vLLM is not installed beside the gateway

# The ModelOpt NVFP4 GLM-4.7-Flash checkpoint was reported not to load before 0.24 (issue 15), but
# nothing in 0.16–0.21's source gates it (0.16's CUTLASS FP4 MoE already covers family 120): the
# plan notes that 0.24 adds a faster SM12x MoE path instead of refusing. The note speaks of the
# native FP4 kernels: on GPUs without them (below 10.0) the checkpoint runs as Marlin W4A16
# (gateway/backends/vllm/weight_kernels.py), and the note is not given.
NOTE_SINCE = {
    ("glm4_moe_lite", "nvfp4"): (
        "0.24.0",
        "vLLM 0.24 adds a faster SM12x NVFP4 MoE backend; earlier releases run it through CUTLASS FP4 MoE",
    ),
}

# --language-model-only (MultiModalConfig.language_model_only) appears in 0.17.0's
# vllm/engine/arg_utils.py; 0.16.0 has no such flag.
LANGUAGE_MODEL_ONLY_SINCE = "0.17.0"

# "CUDA graph memory profiling is enabled (default since v0.21.0)" (0.21.0 v1/worker/gpu_worker.py):
# graphs are subtracted before the KV cache is sized; earlier releases captured them on top.
CUDAGRAPH_RESERVED_SINCE = "0.21.0"


@lru_cache(maxsize=64)
def parse_version(text: str) -> Version:
    """A release's version (a local suffix dropped; the default where it does not parse). Cached: a plan's
    vLLM ladder asks about the same one or two releases tens of thousands of times."""
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version(DEFAULT_VERSION)


@lru_cache(maxsize=256)
def at_least(version: str, since: str) -> bool:
    return parse_version(version) >= parse_version(since)


def cannot_load(facts: CheckpointFacts, version: str) -> str | None:
    """Why this release cannot load the architecture, or None: an architecture some later table's
    registry lists but this release's does not (one no table lists may still load through vLLM's
    Transformers fallback, so it is not refused)."""
    if not facts.architecture:
        return None
    table = table_for(version)
    if table.registers(facts.architecture):
        return None
    since = first_registering(facts.architecture)
    if since is None or not at_least(since, table.read):
        return None
    if not table.exact and next_read(version) == since:
        return None  # not read (0.15.x: wheels only): the release before lacks it, the one after has it
    return (
        f"vLLM {version} cannot load {facts.architecture} (in vllm/model_executor/models/registry.py since "
        f"{since}; not in {table.provenance}): install vLLM {since} or later"
    )


def quantization_verdict(facts: CheckpointFacts, capability: tuple[int, int], version: str) -> Verdict | None:
    """Whether the checkpoint's quantization runs on this capability (its config class's
    ``get_min_capability`` in this release), or None when unquantized or unknown."""
    return table_for(version).quantization_verdict(facts, capability)


def notes(facts: CheckpointFacts, version: str, capability: tuple[int, int] = (0, 0)) -> list[str]:
    """Release notes for this checkpoint that do not change the verdict; on these GPUs
    (``capability``: the lowest), where the checkpoint runs as Marlin weight-only kernels, that
    instead of notes about its native kernels."""
    marlin = weight_only(facts, capability)
    if marlin:
        return [marlin.phrase]
    found = NOTE_SINCE.get((facts.model_type, facts.quantization or ""))
    return [found[1]] if found and not at_least(version, found[0]) else []


def uses_mla(facts: CheckpointFacts, version: str) -> bool:
    """``is_deepseek_mla`` of this release: the model type is listed (exact spelling) and
    kv_lora_rank is set."""
    return table_for(version).uses_mla(facts)


def kv_cache_verdict(facts: CheckpointFacts, capability: tuple[int, int], kv_cache_dtype: str, version: str) -> Verdict:
    """The attention backend this release would pick for the KV dtype on this capability, or why
    none can (e.g. TRITON_MLA, the only MLA backend on 8.x and 12.x, takes no fp8 before 0.18)."""
    return table_for(version).attention_backend(facts, capability, kv_cache_dtype)


def kv_cache_dtype_since(
    facts: CheckpointFacts, capability: tuple[int, int], kv_cache_dtype: str, after: str
) -> str | None:
    """The first release read after ``after`` that has a backend for this KV dtype on this capability."""
    for version in versions():
        if at_least(version, after) and kv_cache_verdict(facts, capability, kv_cache_dtype, version).ok:
            return version
    return None


def fp8_kv_supported(facts: CheckpointFacts, capability: tuple[int, int], version: str) -> bool:
    return kv_cache_verdict(facts, capability, "fp8", version).ok


def mtp_draft(facts: CheckpointFacts, version: str) -> str | None:
    """The draft model type vLLM's ``--speculative-config '{"method": "mtp"}'`` builds from this
    model's own MTP layers in this release (``SpeculativeConfig.hf_config_override``), or None."""
    found = table_for(version).mtp_draft(facts)
    return found[0] if found else None


def default_utilization(version: str) -> float:
    """``CacheConfig.gpu_memory_utilization``'s default: what vLLM checks free memory against when
    the plan passes ``--kv-cache-memory-bytes`` without a utilization (0.9 up to 0.19, 0.92 from 0.21)."""
    return table_for(version).default_utilization


def language_model_only(facts: CheckpointFacts, version: str) -> bool:
    """Text-only serving of a multimodal checkpoint: pass the flag so the towers are neither loaded
    nor profiled (vLLM 0.21 logs "running in text-only mode" and loads fewer bytes)."""
    return facts.vision_bytes > 0 and at_least(version, LANGUAGE_MODEL_ONLY_SINCE)
