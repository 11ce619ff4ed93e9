"""llama.cpp's compute buffers: what each device, and the host, needs beside weights and KV.

Follows llama.cpp build 11434 (``llama-server``) as measured on RPC devices
(``benchmarks/llamacpp_placement.py``; the logs replayed in tests/unit/test_llamacpp_placement.py):

- Per device: the attention masks (one per cache: cells × ubatch, f16 with flash attention) plus the
  peak activations of one block for a 512-token ubatch (dense: 2 hidden + 3 FFN rows; MoE: the routed
  experts' rows). With pipeline parallelism (several devices, every layer offloaded, no tensor
  overrides) ggml's scheduler keeps 4 copies of every input of each device's part of the graph:
  4 × (masks + the hidden state; the first device receives 3 hidden-sized inputs), and the host keeps
  4 copies of the graph inputs. The output layer adds the logits of the reserved outputs (one per slot
  natively; a whole ubatch with llama-cpp-python, whose logits phase can be the peak).
- On a local CUDA GPU (measured on an H100 with a CUDA build of b11434 and shape-true Llama 3 8B and
  70B, ``benchmarks/gpu_llamacpp_memory.py``; the figures in tests/unit/test_llamacpp_cuda_compute.py)
  the graph holds two hidden-sized tensors more, and flash attention takes one layer's K and V as f16
  copies of the whole cache when the cache is quantized (or, with blocks left on the CPU, always,
  plus the quantized rows): the compute buffer is then masks + 5 hidden + those copies, 680 MiB for
  Llama 3 8B at 131,072 with q8_0 where f16 takes 244.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.kv_cache import F32, kv_bytes_per_token_layer, kv_cells, sliding_pattern
from gateway.backends.llamacpp.launcher import UBATCH, Launcher
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.core.devices import Device

SCHED_COPIES = 4  # GGML_SCHED_MAX_COPIES: inputs kept per device with pipeline parallelism


def pipeline_parallel(gpus: tuple[Device, ...], n_gpu_layers: int, facts: GgufFacts, n_cpu_moe: int) -> bool:
    """llama.cpp's condition: several devices, every block and the output offloaded, no tensor
    overrides (``--n-cpu-moe`` is one)."""
    return len(gpus) > 1 and n_gpu_layers > facts.num_layers and not n_cpu_moe


def hidden_bytes(facts: GgufFacts) -> int:
    """One hidden-state tensor of a ubatch (f32)."""
    return facts.hidden_size * UBATCH * F32


def mask_bytes(
    facts: GgufFacts,
    n_ctx: int,
    launcher: Launcher,
    flash_attention: bool,
    layers: range | list[int] | tuple[int, ...] | None = None,
) -> int:
    """The attention masks, one per cache kind (full, sliding) among ``layers`` (default: all):
    cells × ubatch. A device whose blocks all slide receives only the sliding-window mask."""
    element = 2 if flash_attention else 4  # f16 for flash attention, else f32
    layers = range(facts.num_layers) if layers is None else layers
    pattern = sliding_pattern(facts)
    sliding = [layer for layer in layers if pattern[layer]]
    cells = n_ctx if len(sliding) < len(layers) else 0
    if sliding:
        cells += kv_cells(facts, sliding[0], n_ctx, launcher)
    return cells * UBATCH * element


def activation_bytes(facts: GgufFacts, n_ctx: int, flash_attention: bool, ffn: bool = True) -> int:
    """Peak scratch of one block for a ubatch: the FFN (dense: residual, normed input, gate, up and
    their product; MoE: the same for the routed experts' rows, or the experts' down projections) or the
    attention (with flash attention: residual, normed input, Q and the output; without it: the scores
    of the ubatch against the whole cache). ``ffn`` False: the last block alone, whose FFN runs only
    on the rows that are output (llama.cpp drops the others before it)."""
    hidden = hidden_bytes(facts)
    if flash_attention:
        key = facts.cache_key_dim or facts.head_dim
        attention = 2 * hidden + 2 * facts.num_heads * key * UBATCH * F32
    else:
        attention = hidden + n_ctx * UBATCH * facts.num_heads * F32  # scores, softmax in place
    if not ffn:
        return attention
    if facts.is_moe:
        used = max(1, facts.experts_per_token)
        rows = (facts.moe_intermediate_size or facts.intermediate_size) * used * UBATCH * F32
        feed_forward = max(2 * hidden + 3 * rows, hidden + rows + used * hidden)
    else:
        feed_forward = 2 * hidden + 3 * facts.intermediate_size * UBATCH * F32
    return max(feed_forward, attention)


def compute_buffer_bytes(
    facts: GgufFacts,
    n_ctx: int,
    flash_attention: bool,
    holds_output: bool,
    *,
    launcher: Launcher,
    first: bool = False,
    copies: int = 1,
    blocks: range | list[int] | None = None,
) -> int:
    """One device's compute buffer for the ``blocks`` it holds (default: all): masks and block
    activations; with pipeline parallelism (``copies`` > 1) every input of the device's part of the
    graph ``copies`` times (the first device's three hidden-sized inputs, the others' one), kept for
    the whole graph. The output layer's logits come last, when the blocks' scratch is free: a phase of
    their own, the peak for a whole ubatch's logits (llama-cpp-python: 514 MiB logged for Gemma 3's
    262k vocabulary), negligible for the native server's one row per slot."""
    held = None if blocks is None else tuple(blocks)
    return _compute_buffer_bytes(facts, n_ctx, flash_attention, holds_output, launcher, first, copies, held)


@lru_cache(maxsize=4096)
def _compute_buffer_bytes(
    facts: GgufFacts,
    n_ctx: int,
    flash_attention: bool,
    holds_output: bool,
    launcher: Launcher,
    first: bool,
    copies: int,
    blocks: tuple[int, ...] | None,
) -> int:
    """:func:`compute_buffer_bytes`, cached: the placement search tries the same devices' parts again
    and again."""
    hidden = hidden_bytes(facts)
    blocks = tuple(range(facts.num_layers)) if blocks is None else blocks
    masks = mask_bytes(facts, n_ctx, launcher, flash_attention, blocks) if blocks else 0
    last_trunk = facts.num_layers - 1 - facts.mtp_layers  # a nextn block runs its FFN on every row
    full_ffn = any(block != last_trunk for block in blocks)
    activations = activation_bytes(facts, n_ctx, flash_attention, full_ffn) if blocks else 2 * hidden
    kept = 0
    if copies > 1:
        kept = copies * (masks + (3 if first else 1) * hidden)
        body = kept + activations + (2 * hidden if first else 0)
    else:
        body = masks + activations
    if not holds_output:
        return body
    return max(body, kept + launcher.outputs * facts.vocab_size * F32 + 2 * hidden)


def cuda_attention_copies_bytes(
    facts: GgufFacts,
    n_ctx: int,
    kv_type: str,
    launcher: Launcher,
    blocks: range | list[int] | tuple[int, ...],
    blocks_on_host: bool,
) -> int:
    """A local CUDA GPU's compute buffer when flash attention works on f16 copies of a layer's K and V
    (a quantized cache, or blocks left on the CPU): the masks, 5 hidden-sized tensors and the largest
    layer's copies (plus its quantized rows when both hold); 0 when neither holds. Measured, H100, b11434:
    Llama 3 8B at 131,072 680.09 MiB with q8_0 (q4_0 the same; q8_0 K with f16 V 424.08), 70B 720.09."""
    return _cuda_attention_copies_bytes(facts, n_ctx, kv_type, launcher, tuple(blocks), blocks_on_host)


@lru_cache(maxsize=4096)
def _cuda_attention_copies_bytes(
    facts: GgufFacts, n_ctx: int, kv_type: str, launcher: Launcher, blocks: tuple[int, ...], blocks_on_host: bool
) -> int:
    """:func:`cuda_attention_copies_bytes`, cached for the placement search's repeated devices' parts."""
    quantized = kv_type != "f16"
    if not blocks or not (quantized or blocks_on_host):
        return 0
    largest = 0
    for layer in blocks:
        cells = kv_cells(facts, layer, n_ctx, launcher)
        f16 = cells * kv_bytes_per_token_layer(facts, "f16", layer)
        rows = cells * kv_bytes_per_token_layer(facts, kv_type, layer) if quantized and blocks_on_host else 0
        largest = max(largest, int(f16 + rows))
    return mask_bytes(facts, n_ctx, launcher, True, blocks) + 5 * hidden_bytes(facts) + largest


def host_compute_bytes(
    facts: GgufFacts, n_ctx: int, launcher: Launcher, flash_attention: bool, holds_output: bool, copies: int
) -> int:
    """The CPU's compute buffer plus its logits buffer (one row per slot): the graph inputs, masks
    included (``copies`` of them with pipeline parallelism), and the embeddings' rows: 10 hidden-sized
    tensors with pipelining, else a block's scratch and 3 more, as logged for four models."""
    hidden = hidden_bytes(facts)
    masks = mask_bytes(facts, n_ctx, launcher, flash_attention)
    output_buffer = launcher.slots * facts.vocab_size * F32
    if copies > 1:
        return copies * masks + 10 * hidden + output_buffer
    body = masks + activation_bytes(facts, n_ctx, flash_attention) + 3 * hidden
    if holds_output:
        body = max(body, launcher.outputs * facts.vocab_size * F32 + 2 * hidden)
    return body + output_buffer


@lru_cache(maxsize=1024)
def offloaded_weight_bytes(facts: GgufFacts, host_blocks: int, n_cpu_moe: int) -> int:
    """GPU backends run a big batch's matrix products on the first GPU even when the weights stay in
    RAM (llama.cpp's op offload), copying the weights in: about two of the largest such tensors at a
    time (ggml's RPC backend does not offload; estimated, not measured here)."""
    largest = 0
    for layer in range(facts.num_layers):
        size = facts.layer_bytes[layer] if facts.layer_bytes else 0
        experts = facts.expert_layer_bytes[layer] if facts.expert_layer_bytes else 0
        if layer < host_blocks:
            if experts:
                largest = max(largest, experts // 3)
            else:
                key = facts.cache_key_dim or facts.head_dim
                attention = 2 * (facts.num_heads + facts.num_kv_heads) * key
                ffn = facts.intermediate_size
                largest = max(largest, size * ffn // max(1, 3 * ffn + attention))
        elif layer < n_cpu_moe and experts:
            largest = max(largest, experts // 3)
    return 2 * largest


@dataclass(frozen=True)
class GpuCompute:
    """What every GPU's compute buffer depends on in one placement (its ``-ngl`` and ``--n-cpu-moe``),
    worked out once, so that :func:`~backends.llamacpp.placement.place` and the split's sizing (its
    proportional split, :func:`~backends.llamacpp.placement_search.filled_split`) count each card's
    buffer with one function and cannot drift."""

    query: PlacementQuery
    copies: int  # inputs kept per device: SCHED_COPIES with pipeline parallelism, else 1
    host_blocks: int  # blocks left in RAM
    offloaded: int  # the products of weights kept in RAM, which op offload brings to ``offload_to``
    offload_to: int | None  # the first device that can: a local GPU (RPC devices never do)

    @classmethod
    def of(cls, query: PlacementQuery, n_gpu_layers: int, n_cpu_moe: int, op_offload: bool = True) -> GpuCompute:
        facts, gpus = query.facts, query.gpus
        slots = min(n_gpu_layers, facts.num_layers + 1) if gpus else 0
        host_blocks = min(facts.num_layers + 1 - slots, facts.num_layers)
        offloads = op_offload and bool(host_blocks or n_cpu_moe)
        return cls(
            query,
            copies=SCHED_COPIES if pipeline_parallel(gpus, slots, facts, n_cpu_moe) else 1,
            host_blocks=host_blocks,
            offloaded=offloaded_weight_bytes(facts, host_blocks, n_cpu_moe) if offloads else 0,
            offload_to=next((i for i, gpu in enumerate(gpus) if not gpu.is_remote), None),
        )

    def device(self, i: int, *, first: bool, output: bool, blocks: list[int] | None) -> int:
        """GPU ``i``'s compute buffer for the ``blocks`` it holds (None: every block, as the split's
        sizing assumes before the blocks are dealt). A local CUDA GPU adds its graph's own terms, the
        attention phase a peak of its own (:func:`cuda_attention_copies_bytes`); an RPC device keeps
        the buffer measured on ggml-rpc-server."""
        query = self.query
        facts, gpu, flash = query.facts, query.gpus[i], query.flash_attention
        offloaded = self.offloaded if i == self.offload_to else 0
        held = range(facts.num_layers) if blocks is None else blocks
        if not held and not output:
            return offloaded
        compute = offloaded + compute_buffer_bytes(
            facts,
            query.n_ctx,
            flash,
            output,
            launcher=query.launcher,
            first=first,
            copies=self.copies,
            blocks=blocks,
        )
        if flash and not gpu.is_remote and not gpu.is_cpu:
            copies_bytes = cuda_attention_copies_bytes(
                facts, query.n_ctx, query.kv_type, query.launcher, held, self.host_blocks > 0
            )
            compute = max(compute + 2 * hidden_bytes(facts), copies_bytes)
        return compute

    def role(self, i: int, *, first: bool, output: bool) -> int:
        """The compute buffer GPU ``i``'s share of the split leaves room for, before its blocks are
        known: every block, in the GPU's role (first device, output's device)."""
        return _role_compute(self, i, first, output)


@lru_cache(maxsize=1024)
def _role_compute(gpu_compute: GpuCompute, i: int, first: bool, output: bool) -> int:
    """Cached: the placement search sizes the proportional split and then the filled one with the same
    roles at each layer count it tries."""
    return gpu_compute.device(i, first=first, output=output, blocks=None)
