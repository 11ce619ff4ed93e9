"""Where llama.cpp puts each layer, and what that costs per device and in host RAM.

Layer placement follows ``llama_model::load_tensors``: ``-ngl N`` offloads the last N slots (blocks,
then the output layer as one more slot); the token embedding stays on the CPU; offloaded slots are
split across devices by cumulative ``--tensor-split`` fractions. Pure arithmetic over the GGUF's
per-tensor sizes.

KV and compute buffers follow llama.cpp build 11434 (``llama-server``) as measured on RPC devices
(``benchmarks/llamacpp_placement.py``; the logs replayed in tests/unit/test_llamacpp_placement.py):

- KV: one cache of n_ctx cells shared by the slots (``--kv-unified``); a sliding-window layer keeps
  ``slots × window + ubatch`` cells (every slot its window), padded to 256, at most n_ctx.
- Compute, per device: the attention masks (one per cache: cells × ubatch, f16 with flash attention)
  plus the peak activations of one block for a 512-token ubatch (dense: 2 hidden + 3 FFN rows; MoE:
  the routed experts' rows). With pipeline parallelism (several devices, every layer offloaded, no
  tensor overrides) ggml's scheduler keeps 4 copies of every input of each device's part of the
  graph: 4 × (masks + the hidden state; the first device receives 3 hidden-sized inputs), and the host
  keeps 4 copies of the graph inputs. The output layer adds the logits of the reserved outputs (one
  per slot natively; a whole ubatch with llama-cpp-python, whose logits phase can be the peak).
- On a local CUDA GPU (measured on an H100 with a CUDA build of b11434 and shape-true Llama 3 8B and
  70B, ``benchmarks/gpu_llamacpp_memory.py``; the figures in tests/unit/test_llamacpp_cuda_compute.py)
  the graph holds two hidden-sized tensors more, and flash attention takes one layer's K and V as f16
  copies of the whole cache when the cache is quantized (or, with blocks left on the CPU, always,
  plus the quantized rows): the compute buffer is then masks + 5 hidden + those copies, 680 MiB for
  Llama 3 8B at 131,072 with q8_0 where f16 takes 244.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import backends.llamacpp.drafting as drafting
from backends.llamacpp.gguf_facts import SWA_PATTERN, GgufFacts
from gateway.core.devices import GIB, MIB, Device

KV_TYPES = {"f16": (2.0, 1), "q8_0": (34 / 32, 8), "q4_0": (18 / 32, 2)}  # bytes/element, ggml type id
GPU_MARGIN_BYTES = 1024 * MIB  # kept free per GPU, like llama.cpp's --fit-target
HOST_MARGIN_BYTES = 2 * GIB
UBATCH = 512
NATIVE_PARALLEL = 4  # llama-server's slots (-np), sharing one unified KV cache of n_ctx cells (-kvu)
SCHED_COPIES = 4  # GGML_SCHED_MAX_COPIES: inputs kept per device with pipeline parallelism
KV_PAD = 256  # llama.cpp pads cache sizes to 256 cells
_F32 = 4


def recurrent_state_bytes(facts: GgufFacts, launcher: str, draft: str | None = None) -> int:
    """One recurrent layer's states (llama_memory_recurrent, f32): ``n_embd_r`` (conv: (kernel − 1) ×
    (inner + 2 groups × state)) and ``n_embd_s`` (state × inner) per row; a row per slot, times
    1 + the drafted tokens with MTP (``n_rs_seq``: common.h need_n_rs_seq, ``--spec-draft-n-max`` 3)."""
    if facts.recurrent_kind == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, kernel = facts.recurrent_dims
        inner, groups, state = v_heads * v_dim, k_heads, k_dim
    elif facts.recurrent_kind == "mamba2":
        inner, groups, _, _, state, kernel = facts.recurrent_dims
    else:
        return 0
    per_row = (kernel - 1) * (inner + 2 * groups * state) + state * inner
    rows = (NATIVE_PARALLEL if launcher == "native" else 1) * (1 + (drafting.MTP_DRAFT_TOKENS if draft == "mtp" else 0))
    return per_row * _F32 * rows


def kv_bytes_per_token_layer(facts: GgufFacts, kv_type: str, layer: int) -> float:
    """K and V of one token in ``layer`` (MLA: the 576-element latent only, recent builds). Layers
    differ where the GGUF says so (llama.cpp's ``n_embd_k_gqa(il)``): per-layer KV head counts and,
    for sliding layers, their own head sizes (Gemma 4: 16 × (256 + 256) sliding, 4 × (512 + 512)
    full); layers that reuse an earlier layer's cache (``shared_kv_layers``) store nothing."""
    size = KV_TYPES[kv_type][0]
    if facts.is_recurrent(layer):  # a fixed state instead (recurrent_state_bytes)
        return 0.0
    if facts.is_mla:
        return (facts.kv_lora_rank + facts.qk_rope_head_dim) * size
    if facts.shared_kv_layers and layer >= facts.num_layers - facts.shared_kv_layers:
        return 0.0
    heads = facts.kv_heads_per_layer[layer] if facts.kv_heads_per_layer else facts.num_kv_heads
    key = facts.cache_key_dim or facts.head_dim
    value = facts.cache_value_dim or facts.head_dim
    if facts.cache_key_dim_sliding and is_sliding(facts, layer):
        key, value = facts.cache_key_dim_sliding, facts.cache_value_dim_sliding or facts.cache_key_dim_sliding
    return heads * (key + value) * size


def is_sliding(facts: GgufFacts, layer: int) -> bool:
    """Whether block ``layer`` uses the sliding window: the GGUF's per-layer pattern when it has one
    (Gemma 4), else llama.cpp's per-architecture pattern."""
    if not facts.sliding_window:
        return False
    if facts.sliding_per_layer:
        return facts.sliding_per_layer[layer]
    pattern = SWA_PATTERN.get(facts.model_type)
    if pattern is None:
        return layer < facts.sliding_layers
    return layer % pattern < pattern - 1


@lru_cache(maxsize=64)
def _sliding_pattern(facts: GgufFacts) -> tuple[bool, ...]:
    """:func:`is_sliding` for every block, worked out once per model (the placement search needs it
    for every device of every placement it tries)."""
    return tuple(is_sliding(facts, layer) for layer in range(facts.num_layers))


def kv_cells(facts: GgufFacts, layer: int, n_ctx: int, launcher: str) -> int:
    """Cells of one layer's cache. The native server keeps, for a sliding-window layer, every slot's
    window plus a ubatch in one unified cache (2,560 cells for Gemma 3's 512 with -np 4, as logged);
    llama-cpp-python keeps the full-size SWA cache."""
    if launcher == "native" and is_sliding(facts, layer):
        assert facts.sliding_window
        window = facts.sliding_window * NATIVE_PARALLEL + UBATCH
        return min(n_ctx, -(-window // KV_PAD) * KV_PAD)
    return n_ctx


def kv_layer_bytes(
    facts: GgufFacts, layer: int, kv_type: str, n_ctx: int, launcher: str, draft: str | None = None
) -> int:
    """One layer's KV cache, or a recurrent layer's states."""
    if facts.is_recurrent(layer):
        return recurrent_state_bytes(facts, launcher, draft)
    return int(kv_cells(facts, layer, n_ctx, launcher) * kv_bytes_per_token_layer(facts, kv_type, layer))


def uses_flash_attention(launcher: str, gpus: tuple[Device, ...]) -> bool:
    """The native server turns it on by itself; with llama-cpp-python we turn it on for GPUs, where
    without it the attention scores of a long context need gigabytes of scratch per device."""
    return launcher == "native" or bool(gpus)


def pipeline_parallel(gpus: tuple[Device, ...], n_gpu_layers: int, facts: GgufFacts, n_cpu_moe: int) -> bool:
    """llama.cpp's condition: several devices, every block and the output offloaded, no tensor
    overrides (``--n-cpu-moe`` is one)."""
    return len(gpus) > 1 and n_gpu_layers > facts.num_layers and not n_cpu_moe


def _hidden(facts: GgufFacts) -> int:
    """One hidden-state tensor of a ubatch (f32)."""
    return facts.hidden_size * UBATCH * _F32


def _outputs(launcher: str) -> int:
    """Rows of logits the engine reserves: one per slot natively; llama-cpp-python a whole ubatch."""
    return NATIVE_PARALLEL if launcher == "native" else UBATCH


def _mask_bytes(
    facts: GgufFacts,
    n_ctx: int,
    launcher: str,
    flash_attention: bool,
    layers: range | list[int] | tuple[int, ...] | None = None,
) -> int:
    """The attention masks, one per cache kind (full, sliding) among ``layers`` (default: all):
    cells × ubatch. A device whose blocks all slide receives only the sliding-window mask."""
    element = 2 if flash_attention else 4  # f16 for flash attention, else f32
    layers = range(facts.num_layers) if layers is None else layers
    pattern = _sliding_pattern(facts)
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
    hidden = _hidden(facts)
    if flash_attention:
        key = facts.cache_key_dim or facts.head_dim
        attention = 2 * hidden + 2 * facts.num_heads * key * UBATCH * _F32
    else:
        attention = hidden + n_ctx * UBATCH * facts.num_heads * _F32  # scores, softmax in place
    if not ffn:
        return attention
    if facts.is_moe:
        used = max(1, facts.experts_per_token)
        rows = (facts.moe_intermediate_size or facts.intermediate_size) * used * UBATCH * _F32
        feed_forward = max(2 * hidden + 3 * rows, hidden + rows + used * hidden)
    else:
        feed_forward = 2 * hidden + 3 * facts.intermediate_size * UBATCH * _F32
    return max(feed_forward, attention)


def compute_buffer_bytes(
    facts: GgufFacts,
    n_ctx: int,
    flash_attention: bool,
    holds_output: bool,
    *,
    launcher: str = "python",
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
    launcher: str,
    first: bool,
    copies: int,
    blocks: tuple[int, ...] | None,
) -> int:
    """:func:`compute_buffer_bytes`, cached: the placement search tries the same devices' parts again
    and again."""
    hidden = _hidden(facts)
    blocks = tuple(range(facts.num_layers)) if blocks is None else blocks
    masks = _mask_bytes(facts, n_ctx, launcher, flash_attention, blocks) if blocks else 0
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
    return max(body, kept + _outputs(launcher) * facts.vocab_size * _F32 + 2 * hidden)


def cuda_attention_copies_bytes(
    facts: GgufFacts,
    n_ctx: int,
    kv_type: str,
    launcher: str,
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
    facts: GgufFacts, n_ctx: int, kv_type: str, launcher: str, blocks: tuple[int, ...], blocks_on_host: bool
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
    return _mask_bytes(facts, n_ctx, launcher, True, blocks) + 5 * _hidden(facts) + largest


def host_compute_bytes(
    facts: GgufFacts, n_ctx: int, launcher: str, flash_attention: bool, holds_output: bool, copies: int
) -> int:
    """The CPU's compute buffer plus its logits buffer (one row per slot): the graph inputs, masks
    included (``copies`` of them with pipeline parallelism), and the embeddings' rows: 10 hidden-sized
    tensors with pipelining, else a block's scratch and 3 more, as logged for four models."""
    hidden = _hidden(facts)
    masks = _mask_bytes(facts, n_ctx, launcher, flash_attention)
    slots = NATIVE_PARALLEL if launcher == "native" else 1
    output_buffer = slots * facts.vocab_size * _F32
    if copies > 1:
        return copies * masks + 10 * hidden + output_buffer
    body = masks + activation_bytes(facts, n_ctx, flash_attention) + 3 * hidden
    if holds_output:
        body = max(body, _outputs(launcher) * facts.vocab_size * _F32 + 2 * hidden)
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
class Placement:
    n_gpu_layers: int  # llama.cpp's -ngl (blocks + the output slot)
    n_cpu_moe: int  # blocks whose expert tensors stay in RAM (native only)
    tensor_split: tuple[float, ...]
    device_model: tuple[int, ...]
    device_kv: tuple[int, ...]
    device_compute: tuple[int, ...]
    device_usable: tuple[int, ...]
    host_model: int
    host_kv: int
    host_compute: int
    slot_devices: tuple[int | None, ...]  # each slot's device (blocks, then the output layer); None: host RAM
    draft: str | None = None  # llama-server's self-drafting (backends.llamacpp.drafting), counted above
    # what drafting adds, included in the terms above: weights, KV and compute on the GPUs, and in RAM
    draft_bytes: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def host_total(self) -> int:
        return self.host_model + self.host_kv + self.host_compute

    def overflow(self) -> list[int]:
        used = (m + k + c for m, k, c in zip(self.device_model, self.device_kv, self.device_compute, strict=True))
        return [
            index for index, (total, usable) in enumerate(zip(used, self.device_usable, strict=True)) if total > usable
        ]


@lru_cache(maxsize=256)
def _slot_costs(
    facts: GgufFacts, n_ctx: int, kv_type: str, launcher: str, n_cpu_moe: int, draft: str | None = None
) -> tuple[tuple[int, int, int], ...]:
    """Per slot (blocks, then the output layer): (weights on the GPU, expert weights kept in RAM, KV).
    A nextn (MTP) block costs nothing unless drafting loads it: then its weights, and the draft
    context's cache of it (the target's cells and KV type). Cached: the placement search asks for
    the same model, context and KV type once per placement it tries; each ``--n-cpu-moe`` it tries
    is the all-in-RAM costs' first slots followed by the none-in-RAM costs' others."""
    if 0 < n_cpu_moe < facts.num_layers:
        in_ram = _slot_costs(facts, n_ctx, kv_type, launcher, facts.num_layers, draft)
        return in_ram[:n_cpu_moe] + _slot_costs(facts, n_ctx, kv_type, launcher, 0, draft)[n_cpu_moe:]
    kv = _layer_kv(facts, n_ctx, kv_type, launcher, draft)
    costs = []
    for slot in range(facts.num_layers):
        if not drafting.loaded(facts, slot, draft):
            costs.append((0, 0, 0))
            continue
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        experts = facts.expert_layer_bytes[slot] if facts.expert_layer_bytes and slot < n_cpu_moe else 0
        costs.append((size - experts, experts, kv[slot]))
    costs.append((facts.output_bytes, 0, 0))
    return tuple(costs)


@lru_cache(maxsize=64)
def _layer_kv(facts: GgufFacts, n_ctx: int, kv_type: str, launcher: str, draft: str | None) -> tuple[int, ...]:
    """:func:`kv_layer_bytes` of every block (the same for each ``--n-cpu-moe`` the search tries)."""
    return tuple(kv_layer_bytes(facts, slot, kv_type, n_ctx, launcher, draft) for slot in range(facts.num_layers))


@dataclass(frozen=True)
class _GpuCompute:
    """What every GPU's compute buffer depends on in one placement (its ``-ngl`` and ``--n-cpu-moe``),
    worked out once, so that :func:`place` and the split's sizing (:func:`place`'s proportional split,
    :func:`_filled_split`) count each card's buffer with one function and cannot drift."""

    facts: GgufFacts
    gpus: tuple[Device, ...]
    n_ctx: int
    kv_type: str
    launcher: str
    flash: bool
    copies: int  # inputs kept per device: SCHED_COPIES with pipeline parallelism, else 1
    host_blocks: int  # blocks left in RAM
    offloaded: int  # the products of weights kept in RAM, which op offload brings to ``offload_to``
    offload_to: int | None  # the first device that can: a local GPU (RPC devices never do)

    @classmethod
    def of(
        cls,
        facts: GgufFacts,
        gpus: tuple[Device, ...],
        n_ctx: int,
        kv_type: str,
        launcher: str,
        n_gpu_layers: int,
        n_cpu_moe: int,
        op_offload: bool = True,
    ) -> _GpuCompute:
        slots = min(n_gpu_layers, facts.num_layers + 1) if gpus else 0
        host_blocks = min(facts.num_layers + 1 - slots, facts.num_layers)
        offloads = op_offload and bool(host_blocks or n_cpu_moe)
        return cls(
            facts,
            gpus,
            n_ctx,
            kv_type,
            launcher,
            flash=uses_flash_attention(launcher, gpus),
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
        facts, gpu = self.facts, self.gpus[i]
        offloaded = self.offloaded if i == self.offload_to else 0
        held = range(facts.num_layers) if blocks is None else blocks
        if not held and not output:
            return offloaded
        compute = offloaded + compute_buffer_bytes(
            facts,
            self.n_ctx,
            self.flash,
            output,
            launcher=self.launcher,
            first=first,
            copies=self.copies,
            blocks=blocks,
        )
        if self.flash and not gpu.is_remote and not gpu.is_cpu:
            copies_bytes = cuda_attention_copies_bytes(
                facts, self.n_ctx, self.kv_type, self.launcher, held, self.host_blocks > 0
            )
            compute = max(compute + 2 * _hidden(facts), copies_bytes)
        return compute

    def role(self, i: int, *, first: bool, output: bool) -> int:
        """The compute buffer GPU ``i``'s share of the split leaves room for, before its blocks are
        known: every block, in the GPU's role (first device, output's device)."""
        return _role_compute(self, i, first, output)


@lru_cache(maxsize=1024)
def _role_compute(gpu_compute: _GpuCompute, i: int, first: bool, output: bool) -> int:
    """Cached: the placement search sizes the proportional split and then the filled one with the same
    roles at each layer count it tries."""
    return gpu_compute.device(i, first=first, output=output, blocks=None)


def place(
    facts: GgufFacts,
    gpus: tuple[Device, ...],
    n_ctx: int,
    kv_type: str,
    launcher: str,
    n_gpu_layers: int,
    n_cpu_moe: int = 0,
    split: tuple[float, ...] | None = None,
    *,
    op_offload: bool = True,
    draft: str | None = None,
) -> Placement:
    """Memory per device for one placement (pure arithmetic; see :func:`best_placement`).

    ``split`` defaults to llama.cpp's own rule: proportional to each GPU's usable memory.
    ``op_offload`` False: devices that do not run host-resident weights' products (RPC; a remote
    ``Device`` never does)."""
    layers = facts.num_layers
    slots = min(n_gpu_layers, layers + 1) if gpus else 0
    first_gpu_slot = layers + 1 - slots  # slots >= this are on a GPU; slot `layers` is the output
    terms = _GpuCompute.of(facts, gpus, n_ctx, kv_type, launcher, n_gpu_layers, n_cpu_moe, op_offload)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    if split is None and gpus:
        roles = [terms.role(i, first=i == 0, output=i == len(gpus) - 1) for i in range(len(gpus))]
        room = [max(1, u - role) for u, role in zip(usable, roles, strict=True)]
        split = tuple(round(r / sum(room), 4) for r in room)
    split = split or ()
    cumulative = [sum(split[: i + 1]) / sum(split) for i in range(len(split))] if sum(split) else []
    model, kv = [0] * len(gpus), [0] * len(gpus)
    blocks: list[list[int]] = [[] for _ in gpus]
    host_model, host_kv = facts.embedding_bytes, 0
    output_device: int | None = None
    where: list[int | None] = []
    edges = [edge - 1e-9 for edge in cumulative]  # a slot goes to the first device whose edge is past it
    nextn = drafting.mtp_blocks(facts)
    for slot, (on_gpu, in_ram, cache) in enumerate(_slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe, draft)):
        if slot < first_gpu_slot:
            host_model += on_gpu + in_ram
            host_kv += cache
            where.append(None)
            continue
        position = (slot - first_gpu_slot) / slots
        device = min(bisect_right(edges, position), len(gpus) - 1)
        where.append(device)
        model[device] += on_gpu
        kv[device] += cache
        host_model += in_ram
        if slot == layers:
            output_device = device
        elif slot not in nextn:  # the trunk's graph never runs a nextn block
            blocks[device].append(slot)
    first_device = next((i for i, held in enumerate(blocks) if held), None)
    compute = [
        terms.device(i, first=i == first_device, output=i == output_device, blocks=blocks[i]) for i in range(len(gpus))
    ]
    host_compute = host_compute_bytes(facts, n_ctx, launcher, terms.flash, output_device is None, terms.copies)
    extra = _draft_bytes(facts, n_ctx, kv_type, launcher, terms.flash, draft, where)
    if extra.compute_device is None:
        host_compute += extra.compute
    else:
        compute[extra.compute_device] += extra.compute
    return Placement(
        n_gpu_layers=slots,
        n_cpu_moe=n_cpu_moe,
        tensor_split=split,
        device_model=tuple(model),
        device_kv=tuple(kv),
        device_compute=tuple(compute),
        device_usable=tuple(usable),
        host_model=host_model,
        host_kv=host_kv,
        host_compute=host_compute,
        slot_devices=tuple(where),
        draft=draft,
        draft_bytes=extra.totals(),
    )


@dataclass(frozen=True)
class _DraftBytes:
    weights_gpu: int = 0
    kv_gpu: int = 0
    host: int = 0  # weights and KV in RAM (already in the host terms)
    compute: int = 0  # the draft's own buffers, on ``compute_device``
    compute_device: int | None = None  # None: host RAM

    def totals(self) -> tuple[int, int, int, int]:
        """(weights, KV, compute on the GPUs; everything in RAM)."""
        on_gpu = self.compute if self.compute_device is not None else 0
        return (self.weights_gpu, self.kv_gpu, on_gpu, self.host + self.compute - on_gpu)


def _draft_bytes(
    facts: GgufFacts,
    n_ctx: int,
    kv_type: str,
    launcher: str,
    flash: bool,
    draft: str | None,
    where: list[int | None],
) -> _DraftBytes:
    """What drafting adds. draft-mtp: the nextn blocks' weights and cache (already in the slots'
    terms), and the MTP context's compute buffer on the device of the last nextn block: its masks,
    one block's scratch and the logits of one row per slot (estimated the way the trunk's are; no
    MTP GGUF runs on this machine to check it). ngram-mod: its table, in RAM."""
    if draft == "ngram":
        return _DraftBytes(compute=drafting.NGRAM_TABLE_BYTES)
    if draft != "mtp" or not facts.mtp_layers:
        return _DraftBytes()
    nextn = list(drafting.mtp_blocks(facts))
    weights_gpu = kv_gpu = host = 0
    for slot in nextn:
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        cache = kv_layer_bytes(facts, slot, kv_type, n_ctx, launcher)
        if where[slot] is None:
            host += size + cache
        else:
            weights_gpu, kv_gpu = weights_gpu + size, kv_gpu + cache
    compute = compute_buffer_bytes(facts, n_ctx, flash, True, launcher=launcher, blocks=nextn)
    return _DraftBytes(weights_gpu, kv_gpu, host, compute, where[nextn[-1]])


def _filled_split(
    facts: GgufFacts,
    gpus: tuple[Device, ...],
    n_ctx: int,
    kv_type: str,
    launcher: str,
    n_gpu_layers: int,
    n_cpu_moe: int,
    draft: str | None = None,
) -> tuple[float, ...] | None:
    """A split of whole slots, for when the proportional one overflows a card (uneven layers, the
    output layer's logits, the products of weights kept in RAM): the GPUs are filled in order up to
    the same share of their usable memory, the smallest share that holds every slot (bisection), so
    no card is left brimming while the next idles. Each GPU's own part is counted first: its
    compute buffer as first or later device and, on the first local GPU, the copies of weights kept
    in RAM that op offload brings in (what :func:`place` adds; leaving it out filled GPU0 past what
    place accepts; so did leaving out a local CUDA GPU's attention copies). None when the slots
    cannot fit at all."""
    terms = _GpuCompute.of(facts, gpus, n_ctx, kv_type, launcher, n_gpu_layers, n_cpu_moe)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    own = [terms.role(i, first=i == 0, output=False) for i in range(len(gpus))]
    logits_extra = [
        terms.role(i, first=i == 0, output=True) - own[i] for i in range(len(gpus))
    ]  # on the device the output slot lands
    costs = _slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe, draft)[facts.num_layers + 1 - n_gpu_layers :]
    needs = [on_gpu + cache for on_gpu, _, cache in costs]

    none = [0] * len(gpus)

    def fill(share: float) -> list[int] | None:
        counts, used, device = [0] * len(gpus), list(own), 0
        for slot, cost in enumerate(needs):
            extra = logits_extra if slot == len(needs) - 1 else none  # the output layer's slot comes last
            while device < len(gpus) and used[device] + cost + extra[device] > share * usable[device]:
                device += 1
            if device == len(gpus):
                return None
            used[device] += cost + extra[device]
            counts[device] += 1
        return counts

    if fill(1.0) is None:
        return None
    low, high = 0.0, 1.0
    for _ in range(24):  # to a share of 1e-7: far finer than one slot
        middle = (low + high) / 2
        low, high = (low, middle) if fill(middle) is not None else (middle, high)
    counts = fill(high)
    assert counts is not None
    return tuple(float(count) for count in counts)  # llama.cpp normalizes: '10,11' means 10 and 11 slots


def _gpu_bytes_by_layers(facts: GgufFacts, n_ctx: int, kv_type: str, launcher: str, draft: str | None) -> list[int]:
    """For each ``-ngl`` (index), the weights and KV its slots put on the GPUs, whatever the split:
    the last slots' on-GPU costs, as :func:`place` adds them up. A lower bound on what the GPUs must
    hold (compute buffers come on top), so a count whose bound exceeds all the GPUs' usable memory
    together overflows one of them and :func:`best_placement` skips it without placing it."""
    costs = _slot_costs(facts, n_ctx, kv_type, launcher, 0, draft)
    totals = [0]
    for on_gpu, _, cache in reversed(costs):
        totals.append(totals[-1] + on_gpu + cache)
    return totals


def _gpu_bytes_by_experts_in_ram(
    facts: GgufFacts, n_ctx: int, kv_type: str, launcher: str, draft: str | None
) -> list[int]:
    """For each ``--n-cpu-moe`` (index), the weights and KV every slot puts on the GPUs with that
    many blocks' experts in RAM (the same lower bound as :func:`_gpu_bytes_by_layers`)."""
    in_ram = _slot_costs(facts, n_ctx, kv_type, launcher, facts.num_layers, draft)
    none_in_ram = _slot_costs(facts, n_ctx, kv_type, launcher, 0, draft)
    total = sum(on_gpu + cache for on_gpu, _, cache in none_in_ram)
    totals = [total]
    for (kept, _, cache), (whole, _, whole_cache) in zip(in_ram[:-1], none_in_ram[:-1], strict=True):
        total += kept + cache - whole - whole_cache
        totals.append(total)
    return totals


def best_placement(
    facts: GgufFacts, gpus: tuple[Device, ...], n_ctx: int, kv_type: str, launcher: str, draft: str | None = None
) -> tuple[Placement, str]:
    """Everything on the GPUs if it fits; else (native) MoE experts to RAM first; else fewer layers."""
    full = facts.num_layers + 1
    if not gpus:
        return place(facts, gpus, n_ctx, kv_type, launcher, 0, draft=draft), "CPU only"

    def fitting(layers: int, moe: int = 0) -> Placement | None:
        proportional = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe, draft=draft)
        if not proportional.overflow():
            return proportional
        split = _filled_split(facts, gpus, n_ctx, kv_type, launcher, layers, moe, draft)
        filled = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe, split, draft=draft) if split else None
        return filled if filled and not filled.overflow() else None

    room = sum(max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus)
    if everything := fitting(full):
        return everything, "all layers on GPU"
    if launcher == "native" and facts.is_moe and facts.expert_layer_bytes:
        kept = _gpu_bytes_by_experts_in_ram(facts, n_ctx, kv_type, launcher, draft)
        for moe in range(1, facts.num_layers + 1):
            if kept[moe] <= room and (partial := fitting(full, moe)):
                return partial, f"experts of {moe} layers in RAM"
    on_gpus = _gpu_bytes_by_layers(facts, n_ctx, kv_type, launcher, draft)
    for layers in range(full - 1, 0, -1):
        if on_gpus[layers] <= room and (partial := fitting(layers)):
            return partial, f"{layers} of {full} layers on GPU"
    return place(facts, gpus, n_ctx, kv_type, launcher, 0, draft=draft), "CPU only (not one layer fits a GPU)"
