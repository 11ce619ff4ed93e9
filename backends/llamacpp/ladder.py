"""llama.cpp's ladder: the longest context with f16 KV, then q8_0 KV, then shorter contexts (not below
the minimum), each placed as well as the devices allow; host RAM decides whether it fits.

Speed is part of fit: a layer in RAM makes every token wait for host memory (a 70B Q4_K_M on 2×24 GB
with 35 of its 81 layers in RAM decodes several times slower than with all on the GPUs at q8_0 KV).
So :func:`best` prefers, among the fitting candidates, the longest context that keeps every layer
on the GPUs; only when none does, the fastest (by :mod:`backends.llamacpp.speed`'s estimate), then
the longer context. A pinned context (the user asked for it) is the only context evaluated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.llamacpp import drafting, warm_sessions
from backends.llamacpp.placement import HOST_MARGIN_BYTES, Placement, best_placement
from backends.llamacpp.speed import tokens_per_second
from gateway.core.devices import GIB, MIB, Device
from gateway.core.model_facts import ModelFacts
from gateway.core.policy import FALLBACK_CONTEXT

ENGINE = "llamacpp"


def _mib(value: int) -> float:
    return round(value / MIB, 1)


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:,.0f}" if tokens_per_s >= 10 else f"{tokens_per_s:.1f}"


@dataclass
class LlamaCppCandidate:
    checkpoint: str
    launcher: str
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
    # llama-server's prompt cache in RAM and context checkpoints, sized from the RAM left (not in host_total)
    warm: warm_sessions.WarmSessions = field(default_factory=warm_sessions.WarmSessions)

    @property
    def draft(self) -> str | None:
        """Self-drafting speculative decoding (backends.llamacpp.drafting): "mtp", "ngram" or None."""
        return self.placement.draft

    @property
    def label(self) -> str:
        return "llama.cpp"

    @property
    def context_length(self) -> int:
        return self.n_ctx

    @property
    def kv_tokens(self) -> int:
        return self.n_ctx  # one unified cache of n_ctx cells

    @property
    def all_on_gpus(self) -> bool:
        """Every block and the output layer on a GPU, no experts in RAM: nothing waits for the host."""
        return self.level % 4 == 0

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
            "flags": drafting.ARGV[self.draft],
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
            "launcher": self.launcher,
            "checkpoint": self.checkpoint,
            "fits": self.fits,
            "reason": self.reason,
            "n_gpu_layers": p.n_gpu_layers,
            "n_cpu_moe": p.n_cpu_moe,
            "tensor_split": list(p.tensor_split),
            "context_length": self.context_length,  # every engine's name for it
            "n_ctx": self.n_ctx,
            "kv_type": self.kv_type,
            "tokens_per_s_estimate": round(self.tokens_per_s, 1),
            "memory_mib": memory,
            "argv": self.argv,
            "env": self.env,
            "rpc": list(self.rpc),
            "reasoning_format": self.reasoning_format,
            "draft": self._draft_json(),
        }
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
    facts: ModelFacts,
    checkpoint: str,
    gpus: tuple[Device, ...],
    ram_available: int,
    *,
    min_context: int,
    max_context: int | None,
    launcher: str,
    pinned_context_length: int | None = None,
    host_scale: float = 1.0,
    draft: str | None = None,
    optional_draft: str | None = None,
) -> list[LlamaCppCandidate]:
    """The ladder: longest context with f16 KV, then q8_0 KV, then shorter contexts (not below the
    minimum); each placed as well as the GPUs allow with ``draft``, and again with ``optional_draft``
    (a twin :func:`best` takes only where it costs nothing else); host RAM decides whether it fits."""
    model_max = min(facts.max_position or FALLBACK_CONTEXT, max_context or 1 << 30)
    if pinned_context_length:
        contexts = [pinned_context_length]
    else:
        contexts = sorted(
            {c for c in (model_max, 131072, 65536, min_context) if c <= model_max} or {model_max}, reverse=True
        )
    out: list[LlamaCppCandidate] = []
    modes = [(draft, False)] + ([(optional_draft, True)] if optional_draft else [])
    rungs = [(n, k, m) for n in contexts for k in enumerate(("f16", "q8_0")) for m in modes]
    for n_ctx, (kv_index, kv_type), (mode, optional) in rungs:
        placement, how = best_placement(facts, gpus, n_ctx, kv_type, launcher, mode)
        host_need = placement.host_total + HOST_MARGIN_BYTES
        problems = []
        if host_need > ram_available:
            have = ram_available / GIB
            problems.append(f"needs {host_need / GIB:.1f} GiB of RAM (2 GiB margin included), {have:.1f} GiB available")
        if n_ctx < min_context:
            problems.append(f"context {n_ctx:,} < the {min_context:,} required")
        gpu_part = ", ".join(
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
        warm = warm_sessions.WarmSessions()
        if launcher == "native":
            kv_total = sum(placement.device_kv) + placement.host_kv
            warm = warm_sessions.size(
                ram_available - host_need, kv_total, warm_sessions.checkpoint_bytes(facts, kv_type)
            )
        ram = placement.host_total / GIB
        summary = f"{how} ({gpu_part or 'no GPU'}), RAM {ram:.1f} GiB, context {n_ctx:,}, KV {kv_type}"
        level = (
            0
            if placement.n_gpu_layers > facts.num_layers and not placement.n_cpu_moe
            else 1
            if placement.n_cpu_moe
            else 2
        ) + 4 * kv_index
        speed = tokens_per_second(facts, placement, gpus, kv_type, n_ctx, host_scale=host_scale)
        summary += f", ~{_rate(speed)} tokens/s" + _draft_phrase(placement)
        summary += warm.phrase() if launcher == "native" else ""
        out.append(
            LlamaCppCandidate(
                checkpoint,
                launcher,
                n_ctx,
                kv_type,
                placement,
                not problems,
                summary + ("; " + "; ".join(problems) if problems else ""),
                level,
                speed,
                optional=optional,
                warm=warm,
            )
        )
    return out


NEAR_FASTEST = 0.9  # without an all-GPU candidate, speeds within 10 % of the fastest count as equal


def best(candidates: list[LlamaCppCandidate]) -> LlamaCppCandidate | None:
    """The best placement without optional drafting (:func:`_best_placed`); then its twin with MTP
    drafting when that twin fits with the same context, KV type, layers and experts on the GPUs:
    optional drafting is taken only when it costs nothing else."""
    chosen = _best_placed([c for c in candidates if not c.optional])
    if chosen is None:
        return None
    twins = [c for c in candidates if c.optional and c.fits and _concessions(c) == _concessions(chosen)]
    return twins[0] if twins else chosen


def _concessions(candidate: LlamaCppCandidate) -> tuple[int, str, int, int]:
    """What a placement gives up: context, KV type, layers and experts on the GPUs."""
    p = candidate.placement
    return candidate.n_ctx, candidate.kv_type, p.n_gpu_layers, p.n_cpu_moe


def _best_placed(candidates: list[LlamaCppCandidate]) -> LlamaCppCandidate | None:
    """The longest context that keeps every layer on the GPUs (f16 KV before q8_0 at equal context);
    when no fitting candidate does, the fastest, then the longer context, then the fewer concessions
    (on a CPU alone: the fewer concessions, then the longer context). Candidates below the minimum
    context do not fit, so the minimum is always met."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    on_gpus = [c for c in fitting if c.all_on_gpus]
    if on_gpus:
        return min(on_gpus, key=lambda c: (-c.n_ctx, c.level))
    if not any(c.placement.n_gpu_layers for c in fitting):  # CPU only: every candidate waits for RAM alike
        return min(fitting, key=lambda c: (c.level, -c.n_ctx))
    fastest = max(c.tokens_per_s for c in fitting)
    near = [c for c in fitting if c.tokens_per_s >= NEAR_FASTEST * fastest]
    return min(near, key=lambda c: (-c.n_ctx, c.level, -c.tokens_per_s))
