"""Where llama.cpp puts each layer, and what that costs per device and in host RAM.

Layer placement follows ``llama_model::load_tensors``: ``-ngl N`` offloads the last N slots (blocks,
then the output layer as one more slot); the token embedding stays on the CPU; offloaded slots are
split across devices by cumulative ``--tensor-split`` fractions. Pure arithmetic over the GGUF's
per-tensor sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.hardware import GIB, MIB, Gpu
from gateway.modelfacts import ModelFacts

KV_TYPES = {"f16": (2.0, 1), "q8_0": (34 / 32, 8), "q4_0": (18 / 32, 2)}  # bytes/element, ggml type id
GPU_MARGIN_BYTES = 1024 * MIB  # kept free per GPU, like llama.cpp's --fit-target
HOST_MARGIN_BYTES = 2 * GIB
UBATCH = 512
NATIVE_PARALLEL = 4  # llama-server's slots (-np), sharing one unified KV cache of n_ctx cells


def kv_bytes_per_token_layer(facts: ModelFacts, kv_type: str) -> float:
    """K and V of one token in one layer (MLA: the 576-element latent only, recent builds)."""
    size = KV_TYPES[kv_type][0]
    if facts.is_mla:
        return (facts.kv_lora_rank + facts.qk_rope_head_dim) * size
    key = facts.gguf_key_length or facts.head_dim
    value = facts.gguf_value_length or facts.head_dim
    return facts.num_kv_heads * (key + value) * size


def kv_layer_bytes(facts: ModelFacts, layer: int, kv_type: str, n_ctx: int, launcher: str) -> int:
    """One layer's KV cache; the native server gives sliding-window layers a window-sized cache."""
    cells = n_ctx
    sliding = facts.sliding_window and layer < facts.sliding_layers  # approximate: which ones is per-arch
    if sliding and launcher == "native" and facts.sliding_window:
        cells = min(n_ctx, facts.sliding_window + UBATCH)
    return int(cells * kv_bytes_per_token_layer(facts, kv_type))


def uses_flash_attention(launcher: str, gpus: tuple[Gpu, ...]) -> bool:
    """The native server turns it on by itself; with llama-cpp-python we turn it on for GPUs, where
    without it the attention scores of a long context need gigabytes of scratch per device."""
    return launcher == "native" or bool(gpus)


def compute_buffer_bytes(facts: ModelFacts, n_ctx: int, flash_attention: bool, holds_output: bool) -> int:
    """Scratch for one ubatch. Without flash attention: the attention scores of 512 tokens × n_ctx ×
    heads in f32, twice (514 MiB for Gemma 270M at 32k, as logged). With it: the ubatch's logits on
    the device holding the output layer (300 MiB logged for a 152k vocabulary)."""
    if not flash_attention:
        return 2 * n_ctx * UBATCH * facts.num_heads * 4 + 8 * MIB
    if not holds_output:
        return 256 * MIB  # 202-396 MiB logged on the GPUs without the output layer
    # routing a ubatch over many experts needs more scratch: +600 and +900 MiB logged for two MoE models
    return UBATCH * facts.vocab_size * 4 + (512 if facts.is_moe else 32) * MIB


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

    @property
    def host_total(self) -> int:
        return self.host_model + self.host_kv + self.host_compute

    def overflow(self) -> list[int]:
        used = (m + k + c for m, k, c in zip(self.device_model, self.device_kv, self.device_compute, strict=True))
        return [
            index for index, (total, usable) in enumerate(zip(used, self.device_usable, strict=True)) if total > usable
        ]


def _slot_costs(
    facts: ModelFacts, n_ctx: int, kv_type: str, launcher: str, n_cpu_moe: int
) -> list[tuple[int, int, int]]:
    """Per slot (blocks, then the output layer): (weights on the GPU, expert weights kept in RAM, KV)."""
    costs = []
    for slot in range(facts.num_layers):
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        experts = facts.expert_layer_bytes[slot] if facts.expert_layer_bytes and slot < n_cpu_moe else 0
        costs.append((size - experts, experts, kv_layer_bytes(facts, slot, kv_type, n_ctx, launcher)))
    costs.append((facts.output_bytes, 0, 0))
    return costs


def place(
    facts: ModelFacts,
    gpus: tuple[Gpu, ...],
    n_ctx: int,
    kv_type: str,
    launcher: str,
    n_gpu_layers: int,
    n_cpu_moe: int = 0,
    split: tuple[float, ...] | None = None,
) -> Placement:
    """Memory per device for one placement (pure arithmetic; see :func:`best_placement`).

    ``split`` defaults to llama.cpp's own rule: proportional to each GPU's usable memory."""
    layers = facts.num_layers
    slots = min(n_gpu_layers, layers + 1) if gpus else 0
    first_gpu_slot = layers + 1 - slots  # slots >= this are on a GPU; slot `layers` is the output
    flash = uses_flash_attention(launcher, gpus)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    if split is None and gpus:
        room = [max(1, u - compute_buffer_bytes(facts, n_ctx, flash, i == len(gpus) - 1)) for i, u in enumerate(usable)]
        split = tuple(round(r / sum(room), 4) for r in room)
    split = split or ()
    cumulative = [sum(split[: i + 1]) / sum(split) for i in range(len(split))] if sum(split) else []
    model, kv = [0] * len(gpus), [0] * len(gpus)
    host_model, host_kv = facts.embedding_bytes, 0
    output_device: int | None = None
    for slot, (on_gpu, in_ram, cache) in enumerate(_slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe)):
        if slot < first_gpu_slot:
            host_model += on_gpu + in_ram
            host_kv += cache
            continue
        position = (slot - first_gpu_slot) / slots
        device = next((i for i, edge in enumerate(cumulative) if position < edge - 1e-9), len(gpus) - 1)
        model[device] += on_gpu
        kv[device] += cache
        host_model += in_ram
        if slot == layers:
            output_device = device
    compute = tuple(compute_buffer_bytes(facts, n_ctx, flash, i == output_device) for i in range(len(gpus)))
    host_compute = compute_buffer_bytes(facts, n_ctx, flash, True) if output_device is None else 64 * MIB
    return Placement(
        n_gpu_layers=slots,
        n_cpu_moe=n_cpu_moe,
        tensor_split=split,
        device_model=tuple(model),
        device_kv=tuple(kv),
        device_compute=compute,
        device_usable=tuple(usable),
        host_model=host_model,
        host_kv=host_kv,
        host_compute=host_compute,
    )


def _filled_split(
    facts: ModelFacts, gpus: tuple[Gpu, ...], n_ctx: int, kv_type: str, launcher: str, n_gpu_layers: int, n_cpu_moe: int
) -> tuple[float, ...] | None:
    """A split that fills each GPU in turn with whole slots, when the proportional one overflows a
    card (uneven layers, the output layer's logits); None when the slots cannot fit at all."""
    flash = uses_flash_attention(launcher, gpus)
    logits_extra = compute_buffer_bytes(facts, n_ctx, flash, True) - compute_buffer_bytes(facts, n_ctx, flash, False)
    room = [max(0, g.free_bytes - GPU_MARGIN_BYTES) - compute_buffer_bytes(facts, n_ctx, flash, False) for g in gpus]
    costs = _slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe)[facts.num_layers + 1 - n_gpu_layers :]
    counts = [0] * len(gpus)
    device = 0
    for index, (on_gpu, _, cache) in enumerate(costs):
        need = on_gpu + cache + (logits_extra if index == len(costs) - 1 else 0)
        while device < len(gpus) and need > room[device]:
            device += 1
        if device == len(gpus):
            return None
        room[device] -= need
        counts[device] += 1
    return tuple(float(count) for count in counts)  # llama.cpp normalizes: '10,11' means 10 and 11 slots


def best_placement(
    facts: ModelFacts, gpus: tuple[Gpu, ...], n_ctx: int, kv_type: str, launcher: str
) -> tuple[Placement, str]:
    """Everything on the GPUs if it fits; else (native) MoE experts to RAM first; else fewer layers."""
    full = facts.num_layers + 1
    if not gpus:
        return place(facts, gpus, n_ctx, kv_type, launcher, 0), "CPU only"

    def fitting(layers: int, moe: int = 0) -> Placement | None:
        proportional = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe)
        if not proportional.overflow():
            return proportional
        split = _filled_split(facts, gpus, n_ctx, kv_type, launcher, layers, moe)
        filled = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe, split) if split else None
        return filled if filled and not filled.overflow() else None

    if everything := fitting(full):
        return everything, "all layers on GPU"
    if launcher == "native" and facts.is_moe and facts.expert_layer_bytes:
        for moe in range(1, facts.num_layers + 1):
            if partial := fitting(full, moe):
                return partial, f"experts of {moe} layers in RAM"
    for layers in range(full - 1, 0, -1):
        if partial := fitting(layers):
            return partial, f"{layers} of {full} layers on GPU"
    return place(facts, gpus, n_ctx, kv_type, launcher, 0), "CPU only (not one layer fits a GPU)"
