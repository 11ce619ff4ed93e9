"""llama.cpp's ladder: the model's longest context, 131,072, 65,536 and the floor, each with f16 and
q8_0 KV, each placed as well as the devices allow; host RAM decides whether it fits. When none fits
and the floor is the default one (soft), shorter contexts follow as a last resort.

The best is the plan's objective's (``gateway/backends/objective.py``), as for every engine: the floor, then
no layer or expert in RAM beside GPUs (a layer in RAM makes every token wait for host memory), then
context up to the target, then the GGUF's bits per weight, then the estimated decode speed
(:mod:`gateway.backends.llamacpp.speed`), which prices the KV type and the experts in RAM. A pinned context
(the user asked for it) is the only context evaluated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gateway.backends.llamacpp.drafting as drafting
import gateway.backends.llamacpp.warm_sessions as warm_sessions
import gateway.backends.llamacpp.warm_turns as warm_turns
from gateway.backends import objective
from gateway.backends.llamacpp.gguf_facts import GgufFacts, gguf_bits_from_name
from gateway.backends.llamacpp.launcher import NATIVE, Launcher
from gateway.backends.llamacpp.placement import HOST_MARGIN_BYTES, Placement
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.backends.llamacpp.scheduling import Batch, batch
from gateway.backends.llamacpp.speed import decode_rate, tokens_per_second
from gateway.backends.sampling import Sampling, plan_json, plan_line
from gateway.core.devices import GIB, MIB, Device
from gateway.core.policy import DEFAULT_TARGET_CONTEXT, FALLBACK_CONTEXT, Goal

ENGINE = "llamacpp"


def _mib(value: int) -> float:
    return round(value / MIB, 1)


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:,.0f}" if tokens_per_s >= 10 else f"{tokens_per_s:.1f}"


@dataclass
class LlamaCppCandidate:
    checkpoint: str
    launcher: Launcher
    n_ctx: int
    kv_type: str
    placement: Placement
    fits: bool
    reason: str
    level: int  # concessions: 0 all layers on the GPUs, 1 experts in RAM, 2 layers in RAM; +4 q8_0 KV
    tokens_per_s: float = 0.0  # estimated decode speed of one request (backends.llamacpp.speed)
    optional: bool = False  # a twin with optional drafting: chosen only where it costs nothing else
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    engine: str = ENGINE
    rpc: tuple[str, ...] = ()  # other nodes' ggml-rpc-servers, the first devices of the split (issue 13)
    # a hub model's quantizations: the chosen file, every alternative's figures, and why this one won
    variant: dict[str, Any] = field(default_factory=dict)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    alternative_rows: list[str] = field(default_factory=list)
    choice_reason: str = ""
    reasoning_format: str | None = None  # llama-server's --reasoning-format (thinking split out)
    goal: Goal = field(default_factory=Goal)  # the context the plan aims for
    weight_bits: float = 0.0  # the GGUF's bits per weight (0: its type is not known)
    # llama-server's prompt cache in RAM and context checkpoints, sized from the RAM left (not in host_total)
    warm: warm_sessions.WarmSessions = field(default_factory=warm_sessions.WarmSessions)
    devices: tuple[Device, ...] = ()  # the placement's devices in llama.cpp's order (-ts, memory_terms)
    # a model whose cache cannot roll back: what a later turn prefills again (gateway/backends/llamacpp/warm_turns.py)
    warm_turn: warm_turns.WarmTurn | None = None
    facts: GgufFacts | None = None  # the GGUF's, for the estimate of many requests at once (decode_rate)
    host_scale: float = 1.0  # the host's decode term as calibrated on this machine (speed.host_calibration)
    sampling: Sampling | None = None  # the model's recommended sampling, the server's defaults (argv.sampling_argv)

    @property
    def draft(self) -> str | None:
        """Self-drafting speculative decoding (backends.llamacpp.drafting): "mtp", "ngram" or None."""
        return self.placement.draft

    @property
    def label(self) -> str:
        return "llama.cpp"

    @property
    def sampling_applied(self) -> str:
        """How its launcher applies the recommended sampling (or that its own defaults stand)."""
        recommended = self.sampling is not None and self.sampling.recommends
        return self.launcher.sampling_means if recommended else self.launcher.own_sampling

    @property
    def sampling_line(self) -> str:
        return plan_line(self.sampling, self.sampling_applied)

    @property
    def batch(self) -> Batch | None:
        """llama-server's batch size for many sessions and why (backends.llamacpp.scheduling); None for
        llama-cpp-python, whose one slot runs nothing beside a long prefill."""
        if self.launcher is not NATIVE:
            return None
        p = self.placement
        return batch(len(p.tensor_split), on_cpu=p.n_gpu_layers == 0 and not self.rpc, draft=self.draft)

    @property
    def context_length(self) -> int:
        return self.n_ctx

    @property
    def kv_tokens(self) -> int:
        """The unified cache's cells: one request's context and the room for sessions kept warm (-c)."""
        return self.n_ctx + self.warm.room_cells

    @property
    def at_once(self) -> int:
        """Requests the engine runs at once: llama-server's slots, llama-cpp-python's one."""
        return self.launcher.slots

    @property
    def warm_tokens(self) -> int:
        """Prompt tokens kept between turns: the unified cache's cells and what the RAM prompt cache holds."""
        kv_bytes = warm_sessions.kv_total(self.placement)
        cached = self.warm.cache_ram_bytes * self.kv_tokens // kv_bytes if kv_bytes else 0
        return self.kv_tokens + cached

    @property
    def all_on_gpus(self) -> bool:
        """Every block and the output layer on a GPU, no experts in RAM: nothing waits for the host."""
        return self.level % 4 == 0

    @property
    def where(self) -> str:
        """Where the layers are: "2 GPUs (-ts 24,25), all layers", "…, experts of 3 blocks in RAM"."""
        p = self.placement
        gpus = sum(1 for share in p.tensor_split if share > 0) or (1 if p.n_gpu_layers and p.device_usable else 0)
        if not gpus or not p.n_gpu_layers:
            return "CPU only"
        split = f" (-ts {','.join(f'{share:g}' for share in p.tensor_split)})" if len(p.tensor_split) > 1 else ""
        place = f"{gpus} GPU{'s' if gpus > 1 else ''}{split}"
        if p.n_cpu_moe:
            return f"{place}, experts of {p.n_cpu_moe} blocks in RAM"
        return f"{place}, all layers" if self.all_on_gpus else f"{place}, {p.n_gpu_layers} layers (the rest in RAM)"

    @property
    def headline(self) -> str:
        """The decision's line: the GGUF, where its layers are, context, KV type, drafting, tokens/s."""
        gguf = "/".join([self.variant["repo"], self.variant["files"][0]]) if self.variant else self.checkpoint
        draft = f", drafting {self.draft}" if self.draft else ""
        speed = f"~{_rate(self.tokens_per_s)} tokens/s"
        return f"{gguf}, {self.where}, context {self.n_ctx:,}, KV {self.kv_type}{draft}, {speed}"

    @property
    def traits(self) -> objective.Traits:
        """This placement in the plan's objective's terms: layers or experts in RAM beside GPUs are
        CPU offload; a q8_0 KV cache is less precise, taken when it buys context, not for its decode
        estimate alone (measured here: 1.05-1.08x the decode of f16 KV but 0.56x its prefill, and an
        agent's turn is mostly prefill)."""
        on_gpus = bool(self.placement.device_usable)
        return objective.Traits(
            goal=self.goal,
            context=self.n_ctx,
            offload=on_gpus and not self.all_on_gpus,
            weight_bits=self.weight_bits or 16.0,
            kv_bits=8.0 if self.kv_type == "q8_0" else 16.0,
            tokens_per_s=self.tokens_per_s,
            turn_prefill=self.warm_turn.tokens if self.warm_turn else 0,
            tie=(self.level // 4,),
        )

    @property
    def ranks(self) -> int:
        """llama-server runs every layer in one process: never a rank of a group."""
        return 1

    @property
    def nodes(self) -> tuple[str, ...]:
        """The other nodes whose RPC devices hold layers of this placement, in device order."""
        split = self.placement.tensor_split or ((1.0,) if self.placement.n_gpu_layers else ())
        used = [d.node for d, share in zip(self.devices, split, strict=False) if share > 0]
        return tuple(dict.fromkeys(node for node in used if node))

    def decode_rate(self, sequences: int) -> float:
        """Tokens/s of ``sequences`` requests decoding at once in one batch (speed.py); RPC devices on
        other nodes pay their link every step."""
        if self.facts is None:
            return 0.0
        return decode_rate(
            self.facts, self.placement, self.devices, self.kv_type, self.n_ctx, sequences, host_scale=self.host_scale
        )

    def memory_terms(self) -> list[tuple[int, str, int]]:
        p = self.placement
        return [
            (i, term, value)
            for i in range(len(p.device_model))
            for term, value in (
                ("model", p.device_model[i]),
                ("kv_cache", p.device_kv[i]),
                ("compute", p.device_compute[i]),
            )
        ]

    def _draft_json(self) -> dict[str, Any] | None:
        """Drafting and its memory terms (MiB, already inside ``memory_mib``)."""
        if self.draft is None:
            return None
        weights, kv, compute, host = self.placement.draft_bytes
        return {
            "mode": self.draft,
            "flags": [*drafting.ARGV[self.draft], *(self.batch.draft_argv if self.batch else ())],
            "gpu_weights_mib": _mib(weights),
            "gpu_kv_mib": _mib(kv),
            "gpu_compute_mib": _mib(compute),
            "host_mib": _mib(host),
        }

    def to_json(self) -> dict[str, Any]:
        p = self.placement
        memory = {
            f"GPU{i}": {
                "model": _mib(p.device_model[i]),
                "kv": _mib(p.device_kv[i]),
                "compute": _mib(p.device_compute[i]),
                "usable": _mib(p.device_usable[i]),
            }
            for i in range(len(p.device_model))
        }
        memory["host"] = {"model": _mib(p.host_model), "kv": _mib(p.host_kv), "compute": _mib(p.host_compute)}
        memory["host"] |= {"prompt_cache": _mib(self.warm.host_bytes)}
        data = {
            "backend": ENGINE,
            "launcher": self.launcher.name,
            "checkpoint": self.checkpoint,
            "fits": self.fits,
            "reason": self.reason,
            "n_gpu_layers": p.n_gpu_layers,
            "n_cpu_moe": p.n_cpu_moe,
            "tensor_split": list(p.tensor_split),
            "context_length": self.context_length,  # every engine's name for it
            "n_ctx": self.n_ctx,
            "kv_cells": self.kv_tokens,  # llama-server's -c: the context and the warm sessions' room
            "warm_room": {"cells": self.warm.room_cells, "kv_mib": _mib(self.warm.room_bytes)},
            "kv_type": self.kv_type,
            "tokens_per_s_estimate": round(self.tokens_per_s, 1),
            "memory_mib": memory,
            "argv": self.argv,
            "env": self.env,
            "rpc": list(self.rpc),
            "reasoning_format": self.reasoning_format,
            "draft": self._draft_json(),
            "sampling": plan_json(self.sampling, self.sampling_applied),
            "batch": self.batch.why if self.batch else None,
        }
        if self.warm_turn:
            data["warm_turn"] = self.warm_turn.to_json()
        if self.variant:  # a hub model: the file chosen, its alternatives, and why
            data |= {
                "gguf_variant": self.variant,
                "gguf_alternatives": self.alternatives,
                "gguf_choice": self.choice_reason,
            }
        return data


def _draft_phrase(placement: Placement) -> str:
    """The reason's account of drafting and what it costs: "; MTP drafting (draft-mtp): 0.36 GiB of
    nextn weights + 0.05 GiB KV + 0.20 GiB compute on the GPUs"."""
    if placement.draft is None:
        return ""
    weights, kv, compute, host = placement.draft_bytes
    terms = ((weights, "nextn weights"), (kv, "KV"), (compute, "compute"))
    parts = [f"{value / GIB:.2f} GiB {name}" for value, name in terms if value]
    where = " + ".join(parts) + " on the GPUs" if parts else ""
    ram = f"{host / GIB:.2f} GiB in RAM" if host else ""
    return f"; {drafting.LABEL[placement.draft]}: " + (", ".join(p for p in (where, ram) if p) or "no memory")


def candidates(
    facts: GgufFacts,
    checkpoint: str,
    gpus: tuple[Device, ...],
    ram_available: int,
    *,
    min_context: int,
    max_context: int | None,
    launcher: Launcher,
    pinned_context_length: int | None = None,
    host_scale: float = 1.0,
    draft: str | None = None,
    optional_draft: str | None = None,
    goal: Goal | None = None,
) -> list[LlamaCppCandidate]:
    """The ladder: the longest context, the target, 65,536 and the floor, each with f16 and q8_0 KV;
    each placed as well as the GPUs allow with ``draft``, and again with ``optional_draft`` (a twin
    :func:`best` takes only where it costs nothing else); host RAM decides whether it fits. ``goal``:
    the floor and target (unset: ``min_context`` as a hard floor); with a soft floor and nothing
    fitting, halved contexts down to a last resort's shortest, until one fits."""
    goal = goal or Goal(min_context, max(min_context, DEFAULT_TARGET_CONTEXT), hard=True)
    model_max = min(facts.max_position or FALLBACK_CONTEXT, max_context or 1 << 30)
    if pinned_context_length:
        contexts = [pinned_context_length]
    else:
        wanted = (model_max, goal.target, 131072, 65536, goal.floor)
        contexts = sorted({c for c in wanted if c <= model_max} or {model_max}, reverse=True)
    out = _rungs(facts, checkpoint, gpus, ram_available, contexts, goal, launcher, host_scale, draft, optional_draft)
    shorter = contexts[-1] // 2
    while not pinned_context_length and not any(c.fits for c in out) and shorter >= goal.least:
        out += _rungs(
            facts, checkpoint, gpus, ram_available, [shorter], goal, launcher, host_scale, draft, optional_draft
        )
        shorter //= 2
    return out


LOW_BIT = ("Q2", "Q3", "IQ1", "IQ2", "IQ3", "TQ")  # below 4 bits/weight: quality drops steeply


def _bits_per_weight(name: str) -> float:
    """A GGUF's bits per weight from its type's name; 3 for an unlisted type below 4 bits, 4.25 for
    MXFP4 (gpt-oss's experts), 0 when unknown."""
    if bits := gguf_bits_from_name(name):
        return bits
    quant = name.upper().rsplit("/", 1)[-1]
    if "MXFP4" in quant:
        return 4.25
    return 3.0 if any(f"-{low}" in quant or f"_{low}" in quant or quant.startswith(low) for low in LOW_BIT) else 0.0


# Models published quantized: the GGUF type that carries the checkpoint's own format unchanged. gpt-oss
# is released with its experts in MXFP4 (openai/gpt-oss-20b config.json quantization_config
# {quant_method: mxfp4}); convert_hf_to_gguf.py writes those tensors as GGML_TYPE_MXFP4 as they are
# (ggml-org/gpt-oss-20b-GGUF is that file). Any other GGUF of it is requantized from it.
NATIVE_GGUF_TYPES = {"gpt-oss": "MXFP4"}


def native_bits(facts: GgufFacts, file_name: str) -> float:
    """16 (full precision) for a GGUF in the format the model itself was released in, by the type holding
    most of its tensor table's bytes (by its name when no table was read); 0 otherwise."""
    native = NATIVE_GGUF_TYPES.get(facts.model_type.replace("_", "-"))
    if not native:
        return 0.0
    if facts.main_weight_type:
        return 16.0 if facts.main_weight_type == native else 0.0
    return 16.0 if native in file_name.upper().rsplit("/", 1)[-1] else 0.0


def precision_bits(facts: GgufFacts, file_name: str) -> float:
    """What the objective ranks a GGUF's precision by: full (16) in the model's own released format; else
    the file's real bits per weight (its bytes over its weights), else its type's name (sizes estimated)."""
    by_name = _bits_per_weight(facts.quantization or "") or _bits_per_weight(file_name)
    return native_bits(facts, file_name) or facts.bits_per_weight or by_name


def _rungs(
    facts: GgufFacts,
    checkpoint: str,
    gpus: tuple[Device, ...],
    ram_available: int,
    contexts: list[int],
    goal: Goal,
    launcher: Launcher,
    host_scale: float,
    draft: str | None,
    optional_draft: str | None,
) -> list[LlamaCppCandidate]:
    """Each context with f16 and q8_0 KV, with ``draft`` and the ``optional_draft`` twin."""
    bits = precision_bits(facts, checkpoint)
    shared = _RungGround(facts, checkpoint, gpus, ram_available, goal, launcher, host_scale, bits)
    modes = [(draft, False)] + ([(optional_draft, True)] if optional_draft else [])
    rungs = [(n, k, m) for n in contexts for k in enumerate(("f16", "q8_0")) for m in modes]
    return [
        shared.rung(n_ctx, kv_index, kv_type, mode, optional) for n_ctx, (kv_index, kv_type), (mode, optional) in rungs
    ]


@dataclass(frozen=True)
class _RungGround:
    """What every rung of one ladder shares: the GGUF, the devices and RAM, the goal, the launcher."""

    facts: GgufFacts
    checkpoint: str
    gpus: tuple[Device, ...]
    ram_available: int
    goal: Goal
    launcher: Launcher
    host_scale: float
    weight_bits: float  # precision_bits of the GGUF

    def rung(self, n_ctx: int, kv_index: int, kv_type: str, mode: str | None, optional: bool) -> LlamaCppCandidate:
        """One context and KV type placed, with its figures, its reason and why it does not fit."""
        query = PlacementQuery(self.facts, self.gpus, n_ctx, kv_type, self.launcher, mode)
        placement, how = best_placement(query)
        problems = self._problems(placement, n_ctx)
        warm = warm_sessions.WarmSessions()
        if self.launcher.keeps_warm:  # the placement with the room for sessions kept warm (same layers, more cells)
            warm, placement = warm_sessions.keep_warm(
                query, placement, self.ram_available, fits=not problems, sessions=self.goal.sessions
            )
        speed = tokens_per_second(self.facts, placement, self.gpus, kv_type, n_ctx, host_scale=self.host_scale)
        summary = f"{how} ({_gpu_part(placement) or 'no GPU'}), RAM {placement.host_total / GIB:.1f} GiB, "
        summary += f"context {n_ctx:,}, KV {kv_type}, ~{_rate(speed)} tokens/s" + _draft_phrase(placement)
        if not problems and n_ctx < self.goal.floor:
            summary += f"; below the {self.goal.floor:,} floor: a last resort"
        summary += warm.phrase(n_ctx) if self.launcher.keeps_warm else ""
        warm_turn = None
        if self.launcher.keeps_warm:
            needs = warm_sessions.checkpoint_bytes(self.facts, kv_type) > 0
            if warm_turn := warm_turns.turn(needs, warm.checkpoints, n_ctx):
                summary += f"; {warm_turn.phrase}"
        return LlamaCppCandidate(
            self.checkpoint,
            self.launcher,
            n_ctx,
            kv_type,
            placement,
            not problems,
            summary + ("; " + "; ".join(problems) if problems else ""),
            _offload_level(self.facts, placement) + 4 * kv_index,
            speed,
            optional=optional,
            goal=self.goal,
            weight_bits=self.weight_bits,
            warm=warm,
            devices=self.gpus,
            warm_turn=warm_turn,
            facts=self.facts,
            host_scale=self.host_scale,
        )

    def _problems(self, placement: Placement, n_ctx: int) -> list[str]:
        """Why the placement does not fit: the host RAM it needs, a context below what is planned at all."""
        problems = []
        host_need = placement.host_total + HOST_MARGIN_BYTES
        if host_need > self.ram_available:
            have = self.ram_available / GIB
            problems.append(f"needs {host_need / GIB:.1f} GiB of RAM (2 GiB margin included), {have:.1f} GiB available")
        if short := self.goal.too_short(n_ctx):
            problems.append(short)
        return problems


def _gpu_part(placement: Placement) -> str:
    """Each GPU's share of the placement: its weights, KV and compute buffers over what it can use."""
    return ", ".join(
        f"GPU{i} {(m + k + c) / GIB:.1f}/{u / GIB:.1f} GiB"
        for i, (m, k, c, u) in enumerate(
            zip(
                placement.device_model,
                placement.device_kv,
                placement.device_compute,
                placement.device_usable,
                strict=True,
            )
        )
    )


def _offload_level(facts: GgufFacts, placement: Placement) -> int:
    """0: every layer on the GPUs; 1: MoE experts kept in RAM; 2: layers in RAM."""
    if placement.n_gpu_layers > facts.num_layers and not placement.n_cpu_moe:
        return 0
    return 1 if placement.n_cpu_moe else 2


def best(candidates: list[LlamaCppCandidate]) -> LlamaCppCandidate | None:
    """The best placement without optional drafting (by the plan's objective); then its twin with MTP
    drafting when that twin fits with the same context, KV type, layers and experts on the GPUs:
    optional drafting is taken only when it costs nothing else."""
    fitting = [c for c in candidates if c.fits and not c.optional]
    if not fitting:
        return None
    chosen = objective.ranked(fitting, lambda c: c.traits)[0]
    twins = [c for c in candidates if c.optional and c.fits and _concessions(c) == _concessions(chosen)]
    return twins[0] if twins else chosen


def _concessions(candidate: LlamaCppCandidate) -> tuple[int, str, int, int]:
    """What a placement gives up: context, KV type, layers and experts on the GPUs."""
    p = candidate.placement
    return candidate.n_ctx, candidate.kv_type, p.n_gpu_layers, p.n_cpu_moe
