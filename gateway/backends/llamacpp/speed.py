"""Decode speed of a llama.cpp placement, estimated: generating one token reads every weight it uses
and the cached keys and values once, so decode is memory-bandwidth bound. Each device's bytes read
per token over its bandwidth, summed along the pipeline (the layers run one device after another),
gives seconds per token.

What a device reads per token: its blocks' weights (MoE: the shared part plus the routed experts'
share, ``experts_per_token / num_experts``), the output matrix where it sits, and its layers' KV for
:data:`ESTIMATE_CONTEXT` cached tokens (sliding layers: at most their window). The token embedding is
a row lookup, not a read of the matrix. Bandwidths are datasheet peaks, found by the GPU's name, else
by its compute capability (simulated GPUs), else a default (:mod:`gateway.backends.bandwidth`); layers
in RAM run at the host's bandwidth. :data:`EFFICIENCY` is the share of the peak that decode reaches.
The figure ranks placements and tells people what to expect; it is not a benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.backends.bandwidth import HOST_BANDWIDTH_GBPS, gpu_bandwidth, hop_s, link_rtt_s
from gateway.backends.llamacpp.drafting import mtp_blocks
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.kv_cache import is_sliding, kv_bytes_per_token_layer
from gateway.backends.llamacpp.placement import Placement
from gateway.core.devices import Device

EFFICIENCY = 0.7  # share of the peak bandwidth that llama.cpp's decode reaches
ESTIMATE_CONTEXT = 32768  # tokens in the cache while decoding (an agent's typical prompt), at most n_ctx
ACTIVATION_BYTES = 4  # a hidden state crosses to and from an RPC device in 32 bits (ggml's F32 activations)


def bytes_read_per_token(
    facts: GgufFacts, placement: Placement, kv_type: str, n_ctx: int, devices: int, sequences: float = 1
) -> tuple[list[float], float]:
    """(bytes each GPU reads per generated token, bytes the CPU reads); with ``sequences`` requests in one
    step, per step: the weights once (MoE: the experts any of them routes to), each one's KV."""
    cached = min(n_ctx, ESTIMATE_CONTEXT)
    routed = facts.experts_per_token / facts.num_experts if facts.is_moe and facts.num_experts else 1.0
    if sequences > 1 and routed < 1:  # each request routes on its own: 1 - (1 - k/E)^n of the experts
        routed = 1 - (1 - routed) ** sequences
    gpu = [0.0] * devices
    host = 0.0
    for slot, device in enumerate(placement.slot_devices):
        if slot in mtp_blocks(facts):  # the trunk's decode step never reads a nextn block
            continue
        if slot == facts.num_layers:
            read, experts_in_ram = float(facts.output_bytes), 0.0
        else:
            size = facts.layer_bytes[slot] if facts.layer_bytes else facts.weight_bytes / facts.num_layers
            experts = facts.expert_layer_bytes[slot] if facts.expert_layer_bytes else 0
            in_ram = experts if slot < placement.n_cpu_moe else 0
            window = facts.sliding_window if facts.sliding_window and is_sliding(facts, slot) else cached
            kv = kv_bytes_per_token_layer(facts, kv_type, slot) * min(cached, window) * sequences
            # the GPU reads the block less its experts, plus the routed share of the experts it holds
            read = size - experts + (experts - in_ram) * routed + kv
            experts_in_ram = in_ram * routed
        host += experts_in_ram
        if device is None:
            host += read
        else:
            gpu[device] += read
    return gpu, host


def tokens_per_second(
    facts: GgufFacts,
    placement: Placement,
    gpus: Sequence[Device],
    kv_type: str,
    n_ctx: int,
    *,
    host_scale: float = 1.0,
) -> float:
    """Estimated decode tokens/s of one request: 1 / Σ (bytes read on a device / its bandwidth).
    ``host_scale``: measured / estimated decode of a configuration that ran on this host's CPU
    alone (:func:`host_calibration`), which replaces the assumed host bandwidth by what it did."""
    gpu_bytes, host_bytes = bytes_read_per_token(facts, placement, kv_type, n_ctx, len(gpus))
    seconds = sum(read / (gpu_bandwidth(g) * EFFICIENCY) for read, g in zip(gpu_bytes, gpus, strict=True))
    seconds += host_bytes / (HOST_BANDWIDTH_GBPS * 1e9 * EFFICIENCY * host_scale)
    return 1 / seconds if seconds > 0 else 0.0


def decode_rate(
    facts: GgufFacts,
    placement: Placement,
    gpus: Sequence[Device],
    kv_type: str,
    n_ctx: int,
    sequences: int,
    *,
    host_scale: float = 1.0,
) -> float:
    """Tokens/s of ``sequences`` requests decoding at once in llama-server's one batch: one step reads the
    weights once and each request's KV, device after device. Each RPC device on another node adds two
    crossings of its link per step (the head sends it the step's graph and reads back its activations:
    README "Two machines, one model"), which no request shares with another."""
    if sequences < 1:
        return 0.0
    gpu_bytes, host_bytes = bytes_read_per_token(facts, placement, kv_type, n_ctx, len(gpus), sequences)
    seconds = sum(read / (gpu_bandwidth(g) * EFFICIENCY) for read, g in zip(gpu_bytes, gpus, strict=True))
    seconds += host_bytes / (HOST_BANDWIDTH_GBPS * 1e9 * EFFICIENCY * host_scale)
    remote = [g for g, read in zip(gpus, gpu_bytes, strict=True) if g.is_remote and read > 0]
    payload = sequences * facts.hidden_size * ACTIVATION_BYTES
    seconds += sum(2 * hop_s(link_rtt_s([g]), payload) for g in remote)
    return sequences / seconds if seconds > 0 else 0.0


def host_calibration(remembered: dict[str, Any] | None) -> float:
    """measured / estimated decode speed of a remembered llama.cpp configuration that ran with no
    layer on a GPU (memo ``gpu_layers`` 0): the host's bandwidth term learns from its engine's own
    timings. 1.0 when there is no such measurement."""
    if not remembered or remembered.get("engine") != "llamacpp":
        return 1.0
    memo = remembered.get("memo") or {}
    measured = remembered.get("measured") or {}
    decode, estimated = measured.get("decode_tokens_per_s"), measured.get("estimated_decode_tokens_per_s")
    if memo.get("gpu_layers") != 0 or not decode or not estimated:
        return 1.0
    return float(decode) / float(estimated)
