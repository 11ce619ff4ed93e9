"""Where llama.cpp puts each layer, and what that costs per device and in host RAM: one placement.

Layer placement follows ``llama_model::load_tensors``: ``-ngl N`` offloads the last N slots (blocks,
then the output layer as one more slot); the token embedding stays on the CPU; offloaded slots are
split across devices by cumulative ``--tensor-split`` fractions. Pure arithmetic over the GGUF's
per-tensor sizes, the KV cache (:mod:`gateway.backends.llamacpp.kv_cache`) and the compute buffers
(:mod:`gateway.backends.llamacpp.compute_buffers`); the search for the best placement is
:mod:`gateway.backends.llamacpp.placement_search`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import gateway.backends.llamacpp.drafting as drafting
from gateway.backends.llamacpp.compute_buffers import GpuCompute, compute_buffer_bytes, host_compute_bytes
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.kv_cache import kv_bytes_by_layer, kv_layer_bytes
from gateway.backends.llamacpp.launcher import Launcher
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.core.devices import GIB, MIB

GPU_MARGIN_BYTES = 1024 * MIB  # kept free per GPU, like llama.cpp's --fit-target
HOST_MARGIN_BYTES = 2 * GIB


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


def slot_costs(query: PlacementQuery, n_cpu_moe: int) -> tuple[tuple[int, int, int], ...]:
    """Per slot (blocks, then the output layer): (weights on the GPU, expert weights kept in RAM, KV)
    with ``n_cpu_moe`` blocks' experts in RAM (:func:`_slot_costs`)."""
    return _slot_costs(query.facts, query.n_ctx, query.kv_type, query.launcher, n_cpu_moe, query.draft)


@lru_cache(maxsize=256)
def _slot_costs(
    facts: GgufFacts, n_ctx: int, kv_type: str, launcher: Launcher, n_cpu_moe: int, draft: str | None = None
) -> tuple[tuple[int, int, int], ...]:
    """Per slot (blocks, then the output layer): (weights on the GPU, expert weights kept in RAM, KV).
    A nextn (MTP) block costs nothing unless drafting loads it: then its weights, and the draft
    context's cache of it (the target's cells and KV type). Cached: the placement search asks for
    the same model, context and KV type once per placement it tries; each ``--n-cpu-moe`` it tries
    is the all-in-RAM costs' first slots followed by the none-in-RAM costs' others."""
    if 0 < n_cpu_moe < facts.num_layers:
        in_ram = _slot_costs(facts, n_ctx, kv_type, launcher, facts.num_layers, draft)
        return in_ram[:n_cpu_moe] + _slot_costs(facts, n_ctx, kv_type, launcher, 0, draft)[n_cpu_moe:]
    kv = kv_bytes_by_layer(facts, kv_type, n_ctx, launcher, draft)
    weights = _block_weights(facts, n_cpu_moe > 0, draft)
    blocks = (
        (on_gpu, in_ram, cache if loaded else 0) for (on_gpu, in_ram, loaded), cache in zip(weights, kv, strict=True)
    )
    return (*blocks, (facts.output_bytes, 0, 0))


@lru_cache(maxsize=64)
def _block_weights(facts: GgufFacts, experts_in_ram: bool, draft: str | None) -> tuple[tuple[int, int, bool], ...]:
    """Per block: (weights on the GPU, expert weights in RAM, whether llama.cpp loads it), with every block's
    experts in RAM or none (the same for each context the plan tries)."""
    weights = []
    for slot in range(facts.num_layers):
        if not drafting.loaded(facts, slot, draft):
            weights.append((0, 0, False))
            continue
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        experts = facts.expert_layer_bytes[slot] if facts.expert_layer_bytes and experts_in_ram else 0
        weights.append((size - experts, experts, True))
    return tuple(weights)


def place(
    query: PlacementQuery,
    n_gpu_layers: int,
    n_cpu_moe: int = 0,
    split: tuple[float, ...] | None = None,
    *,
    op_offload: bool = True,
) -> Placement:
    """Memory per device for one placement of ``query`` (pure arithmetic; see
    :func:`gateway.backends.llamacpp.placement_search.best_placement`).

    ``split`` defaults to llama.cpp's own rule: proportional to each GPU's usable memory.
    ``op_offload`` False: devices that do not run host-resident weights' products (RPC; a remote
    ``Device`` never does)."""
    facts, gpus = query.facts, query.gpus
    slots = min(n_gpu_layers, facts.num_layers + 1) if gpus else 0
    terms = GpuCompute.of(query, n_gpu_layers, n_cpu_moe, op_offload)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    if split is None and gpus:
        roles = [terms.role(i, first=i == 0, output=i == len(gpus) - 1) for i in range(len(gpus))]
        room = [max(1, u - role) for u, role in zip(usable, roles, strict=True)]
        split = tuple(round(r / sum(room), 4) for r in room)
    split = split or ()
    held = _held(query, n_cpu_moe, slots, split)
    first_device = next((i for i, blocks in enumerate(held.blocks) if blocks), None)
    output = held.output_device
    compute = [
        terms.device(i, first=i == first_device, output=i == output, blocks=held.blocks[i]) for i in range(len(gpus))
    ]
    flash = query.flash_attention
    host_compute = host_compute_bytes(facts, query.n_ctx, query.launcher, flash, output is None, terms.copies)
    extra = _draft_bytes(query, held.where)
    if extra.compute_device is None:
        host_compute += extra.compute
    else:
        compute[extra.compute_device] += extra.compute
    return Placement(
        n_gpu_layers=slots,
        n_cpu_moe=n_cpu_moe,
        tensor_split=split,
        device_model=held.model,
        device_kv=held.kv,
        device_compute=tuple(compute),
        device_usable=tuple(usable),
        host_model=held.host_model,
        host_kv=held.host_kv,
        host_compute=host_compute,
        slot_devices=held.where,
        draft=query.draft,
        draft_bytes=extra.totals(),
    )


@dataclass(frozen=True)
class _Held:
    """Where one placement's slots went: each GPU's weights, KV and trunk blocks, the rest in host RAM."""

    model: tuple[int, ...]
    kv: tuple[int, ...]
    blocks: tuple[list[int], ...]  # per GPU, the trunk's blocks it runs (compute buffers follow them)
    host_model: int  # the token embedding, the blocks left in RAM and the experts kept there
    host_kv: int
    output_device: int | None  # None: the output layer stays in RAM
    where: tuple[int | None, ...]  # each slot's device; None: host RAM


def _held(query: PlacementQuery, n_cpu_moe: int, slots: int, split: tuple[float, ...]) -> _Held:
    """The last ``slots`` slots on the GPUs, split by the cumulative fractions of ``split``; the others in RAM.
    Each device takes a run of consecutive slots, so its terms are differences of the slots' running sums."""
    facts, devices = query.facts, len(query.gpus)
    layers = facts.num_layers
    first_gpu_slot = layers + 1 - slots  # slots >= this are on a GPU; slot `layers` is the output
    sums = _running_sums(slot_costs(query, n_cpu_moe))
    starts = [first_gpu_slot + _first_at(slots, edge) for edge in _edges(split, devices)] + [layers + 1]
    model = tuple(sums.on_gpu[end] - sums.on_gpu[begin] for begin, end in itertools.pairwise(starts))
    kv = tuple(sums.cache[end] - sums.cache[begin] for begin, end in itertools.pairwise(starts))
    nextn = drafting.mtp_blocks(facts)  # the trunk's graph never runs a nextn block
    blocks = tuple(
        [slot for slot in range(begin, min(end, layers)) if slot not in nextn]
        for begin, end in itertools.pairwise(starts)
    )
    output_device = next((d for d in range(devices) if starts[d] <= layers < starts[d + 1]), None)
    host_model = facts.embedding_bytes + sums.on_gpu[first_gpu_slot] + sums.in_ram[first_gpu_slot]
    host_model += sums.in_ram[layers + 1] - sums.in_ram[first_gpu_slot]  # experts kept in RAM on the GPUs' slots
    where: tuple[int | None, ...] = (None,) * first_gpu_slot + tuple(
        itertools.chain.from_iterable((d,) * (starts[d + 1] - starts[d]) for d in range(devices))
    )
    return _Held(model, kv, blocks, host_model, sums.cache[first_gpu_slot], output_device, where)


def _edges(split: tuple[float, ...], devices: int) -> list[float]:
    """Where each device after the first begins, as a fraction of the offloaded slots: llama.cpp's cumulative
    split (a slot goes to the first device whose edge is past its position); the last device takes the rest."""
    total = sum(split)
    if not total or devices < 2:
        return [0.0, *[2.0] * (devices - 1)] if devices else []
    cumulative = [sum(split[: i + 1]) / total - 1e-9 for i in range(len(split))]
    return [0.0, *cumulative[: devices - 1]]


def _first_at(slots: int, edge: float) -> int:
    """The first offloaded slot ``k`` (of ``slots``) whose position ``k / slots`` is at or past ``edge``."""
    if edge <= 0:
        return 0
    first = min(slots, max(0, math.ceil(edge * slots)))
    while first > 0 and (first - 1) / slots >= edge:
        first -= 1
    while first < slots and first / slots < edge:
        first += 1
    return first


@dataclass(frozen=True)
class _Sums:
    """Running sums of each slot term: ``on_gpu[i]`` is the weights of slots ``0 .. i - 1``."""

    on_gpu: tuple[int, ...]
    in_ram: tuple[int, ...]
    cache: tuple[int, ...]


@lru_cache(maxsize=256)
def _running_sums(costs: tuple[tuple[int, int, int], ...]) -> _Sums:
    """Cached by the costs (one tuple per model, context and experts in RAM): the search places the same
    costs over many layer counts and splits."""
    columns = list(zip(*costs, strict=True)) or [(), (), ()]
    on_gpu, in_ram, cache = (tuple(itertools.accumulate(column, initial=0)) for column in columns)
    return _Sums(on_gpu, in_ram, cache)


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


def _draft_bytes(query: PlacementQuery, where: tuple[int | None, ...]) -> _DraftBytes:
    """What drafting adds. draft-mtp: the nextn blocks' weights and cache (already in the slots'
    terms), and the MTP context's compute buffer on the device of the last nextn block: its masks,
    one block's scratch and the logits of one row per slot (estimated the way the trunk's are; no
    MTP GGUF runs on this machine to check it). ngram-mod: its table, in RAM."""
    facts, draft = query.facts, query.draft
    if draft == "ngram":
        return _DraftBytes(compute=drafting.NGRAM_TABLE_BYTES)
    if draft != "mtp" or not facts.mtp_layers:
        return _DraftBytes()
    nextn = list(drafting.mtp_blocks(facts))
    weights_gpu = kv_gpu = host = 0
    for slot in nextn:
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        cache = kv_layer_bytes(facts, slot, query.kv_type, query.n_ctx, query.launcher)
        if where[slot] is None:
            host += size + cache
        else:
            weights_gpu, kv_gpu = weights_gpu + size, kv_gpu + cache
    compute = compute_buffer_bytes(
        facts, query.n_ctx, query.flash_attention, True, launcher=query.launcher, blocks=nextn
    )
    return _DraftBytes(weights_gpu, kv_gpu, host, compute, where[nextn[-1]])
