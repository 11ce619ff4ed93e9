"""The best placement of one rung: everything on the GPUs if it fits, else (where the launcher can)
MoE experts to RAM, else fewer layers; each tried with llama.cpp's proportional split and, where that
overflows a card, a split of whole slots filled in order. Counts whose weights and KV alone exceed the
GPUs' room together are skipped without placing them."""

from __future__ import annotations

import bisect
import itertools
import math

from gateway.backends.llamacpp.compute_buffers import GpuCompute
from gateway.backends.llamacpp.placement import GPU_MARGIN_BYTES, Placement, place, slot_costs
from gateway.backends.llamacpp.placement_query import PlacementQuery


def filled_split(query: PlacementQuery, n_gpu_layers: int, n_cpu_moe: int) -> tuple[float, ...] | None:
    """A split of whole slots, for when the proportional one overflows a card (uneven layers, the
    output layer's logits, the products of weights kept in RAM): the GPUs are filled in order up to
    the same share of their usable memory, the smallest share that holds every slot (bisection), so
    no card is left brimming while the next idles. Each GPU's own part is counted first: its
    compute buffer as first or later device and, on the first local GPU, the copies of weights kept
    in RAM that op offload brings in (what :func:`place` adds; leaving it out filled GPU0 past what
    place accepts; so did leaving out a local CUDA GPU's attention copies). None when the slots
    cannot fit at all."""
    facts, gpus = query.facts, query.gpus
    terms = GpuCompute.of(query, n_gpu_layers, n_cpu_moe)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    own = [terms.role(i, first=i == 0, output=False) for i in range(len(gpus))]
    logits_extra = [
        terms.role(i, first=i == 0, output=True) - own[i] for i in range(len(gpus))
    ]  # on the device the output slot lands
    costs = slot_costs(query, n_cpu_moe)[facts.num_layers + 1 - n_gpu_layers :]
    placed = list(itertools.accumulate((on_gpu + cache for on_gpu, _, cache in costs), initial=0))
    last = len(costs)  # the output layer's slot comes last

    def fill(share: float) -> list[int] | None:
        """Each GPU in turn takes the most slots that fit under ``share`` of it (found in the running
        sums: bytes are whole, so the room is too), the output slot with its logits."""
        counts, slot = [0] * len(gpus), 0
        for device in range(len(gpus)):
            room = math.floor(share * usable[device]) - own[device]
            end = max(slot, bisect.bisect_right(placed, placed[slot] + room, slot, last) - 1)
            if end == last - 1 and placed[last] - placed[slot] + logits_extra[device] <= room:
                end = last
            counts[device], slot = end - slot, end
            if slot == last:
                return counts
        return None

    if fill(1.0) is None:
        return None
    low, high = 0.0, 1.0
    for _ in range(24):  # to a share of 1e-7: far finer than one slot
        middle = (low + high) / 2
        low, high = (low, middle) if fill(middle) is not None else (middle, high)
    counts = fill(high)
    assert counts is not None
    return tuple(float(count) for count in counts)  # llama.cpp normalizes: '10,11' means 10 and 11 slots


def gpu_bytes_by_layers(query: PlacementQuery) -> list[int]:
    """For each ``-ngl`` (index), the weights and KV its slots put on the GPUs, whatever the split:
    the last slots' on-GPU costs, as :func:`place` adds them up. A lower bound on what the GPUs must
    hold (compute buffers come on top), so a count whose bound exceeds all the GPUs' usable memory
    together overflows one of them and :func:`best_placement` skips it without placing it."""
    costs = slot_costs(query, 0)
    totals = [0]
    for on_gpu, _, cache in reversed(costs):
        totals.append(totals[-1] + on_gpu + cache)
    return totals


def gpu_bytes_by_experts_in_ram(query: PlacementQuery) -> list[int]:
    """For each ``--n-cpu-moe`` (index), the weights and KV every slot puts on the GPUs with that
    many blocks' experts in RAM (the same lower bound as :func:`gpu_bytes_by_layers`)."""
    in_ram = slot_costs(query, query.facts.num_layers)
    none_in_ram = slot_costs(query, 0)
    total = sum(on_gpu + cache for on_gpu, _, cache in none_in_ram)
    totals = [total]
    for (kept, _, cache), (whole, _, whole_cache) in zip(in_ram[:-1], none_in_ram[:-1], strict=True):
        total += kept + cache - whole - whole_cache
        totals.append(total)
    return totals


def best_placement(query: PlacementQuery) -> tuple[Placement, str]:
    """Everything on the GPUs if it fits; else (a launcher that can) MoE experts to RAM first; else fewer layers."""
    facts, gpus = query.facts, query.gpus
    full = facts.num_layers + 1
    if not gpus:
        return place(query, 0), "CPU only"

    def fitting(layers: int, moe: int = 0) -> Placement | None:
        proportional = place(query, layers, moe)
        if not proportional.overflow():
            return proportional
        split = filled_split(query, layers, moe)
        filled = place(query, layers, moe, split) if split else None
        return filled if filled and not filled.overflow() else None

    room = sum(max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus)
    if everything := fitting(full):
        return everything, "all layers on GPU"
    if query.launcher.experts_in_ram and facts.is_moe and facts.expert_layer_bytes:
        kept = gpu_bytes_by_experts_in_ram(query)
        for moe in range(1, facts.num_layers + 1):
            if kept[moe] <= room and (partial := fitting(full, moe)):
                return partial, f"experts of {moe} layers in RAM"
    on_gpus = gpu_bytes_by_layers(query)
    for layers in range(full - 1, 0, -1):
        if on_gpus[layers] <= room and (partial := fitting(layers)):
            return partial, f"{layers} of {full} layers on GPU"
    return place(query, 0), "CPU only (not one layer fits a GPU)"
