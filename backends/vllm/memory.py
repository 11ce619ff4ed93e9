"""vLLM's GPU memory, term by term, as ``gpu_worker.determine_available_memory`` computes it::

    available_kv = total × gpu_memory_utilization − weights − peak_activation − non_torch − cudagraph

KV bytes per token follow ``kv_cache_interface``: ``2 × kv_heads_per_gpu × head_dim × dtype`` per
layer (KV heads replicated when TP exceeds them), or ``(kv_lora_rank + qk_rope_head_dim) × dtype``
per layer for MLA (not ×2, not split by TP). Activation, non-torch and CUDA-graph terms are
estimates calibrated on published start-up logs (benchmarks/plan_accuracy.py reports the errors).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from gateway.hardware import GIB, Gpu
from gateway.modelfacts import ModelFacts

DEFAULT_VERSION = "0.32.0"  # assumed when vLLM is not installed beside the gateway
CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # exists before vLLM's free-memory snapshot
BLOCK_TOKENS = 16
# compute capability each quantization needs on NVIDIA GPUs (vLLM's kernels)
MIN_CAPABILITY = {"fp8": (8, 9), "nvfp4": (10, 0), "mxfp4": (8, 0), "awq": (7, 5), "gptq": (7, 0), "int8": (7, 5)}
# Architectures vLLM runs with MLA, and the release since which it does (PR #32759 for glm4_moe_lite).
MLA_SINCE = {"deepseek_v2": "0.7.0", "deepseek_v3": "0.7.0", "kimi_k2": "0.9.0", "glm4_moe_lite": "0.15.0"}
CUDAGRAPH_RESERVED_SINCE = Version("0.21.0")  # earlier releases captured graphs on top of the KV budget


def parse_version(text: str) -> Version:
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
    return facts.is_mla and since is not None and parse_version(version) >= Version(since)


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
    reserved = parse_version(version) >= CUDAGRAPH_RESERVED_SINCE
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
