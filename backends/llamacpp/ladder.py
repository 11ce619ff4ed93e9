"""llama.cpp's ladder: the longest context with f16 KV, then q8_0 KV, then shorter contexts (not below
the minimum), each placed as well as the devices allow; host RAM decides whether it fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.llamacpp.placement import HOST_MARGIN_BYTES, Placement, best_placement
from gateway.hardware import GIB, MIB, Gpu
from gateway.modelfacts import ModelFacts
from gateway.policy import FALLBACK_CONTEXT

ENGINE = "llamacpp"


def _mib(value: int) -> float:
    return round(value / MIB, 1)


@dataclass
class LlamaCppCandidate:
    checkpoint: str
    launcher: str
    n_ctx: int
    kv_type: str
    placement: Placement
    fits: bool
    reason: str
    level: int
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    engine: str = ENGINE

    @property
    def label(self) -> str:
        return "llama.cpp"

    @property
    def context(self) -> int:
        return self.n_ctx

    @property
    def kv_tokens(self) -> int:
        return self.n_ctx  # one unified cache of n_ctx cells

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
        return {
            "backend": ENGINE,
            "launcher": self.launcher,
            "checkpoint": self.checkpoint,
            "fits": self.fits,
            "reason": self.reason,
            "n_gpu_layers": p.n_gpu_layers,
            "n_cpu_moe": p.n_cpu_moe,
            "tensor_split": list(p.tensor_split),
            "n_ctx": self.n_ctx,
            "kv_type": self.kv_type,
            "memory_mib": memory,
            "argv": self.argv,
            "env": self.env,
        }


def candidates(
    facts: ModelFacts,
    checkpoint: str,
    gpus: tuple[Gpu, ...],
    ram_available: int,
    *,
    min_context: int,
    max_context: int | None,
    launcher: str,
    pinned_ctx: int | None = None,
) -> list[LlamaCppCandidate]:
    """The ladder: longest context with f16 KV, then q8_0 KV, then shorter contexts (not below the
    minimum); each placed as well as the GPUs allow; host RAM decides whether it fits."""
    model_max = min(facts.max_position or FALLBACK_CONTEXT, max_context or 1 << 30)
    if pinned_ctx:
        contexts = [pinned_ctx]
    else:
        contexts = sorted(
            {c for c in (model_max, 131072, 65536, min_context) if c <= model_max} or {model_max}, reverse=True
        )
    out: list[LlamaCppCandidate] = []
    for ctx_index, n_ctx in enumerate(contexts):
        for kv_index, kv_type in enumerate(("f16", "q8_0")):
            placement, how = best_placement(facts, gpus, n_ctx, kv_type, launcher)
            host_need = placement.host_total + HOST_MARGIN_BYTES
            problems = []
            if host_need > ram_available:
                have = ram_available / GIB
                problems.append(
                    f"needs {host_need / GIB:.1f} GiB of RAM (2 GiB margin included), {have:.1f} GiB available"
                )
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
            ram = placement.host_total / GIB
            summary = f"{how} ({gpu_part or 'no GPU'}), RAM {ram:.1f} GiB, context {n_ctx:,}, KV {kv_type}"
            level = (
                (
                    0
                    if placement.n_gpu_layers > facts.num_layers and not placement.n_cpu_moe
                    else 1
                    if placement.n_cpu_moe
                    else 2
                )
                + 4 * kv_index
                + 8 * ctx_index
            )
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
                )
            )
    return out


def best(candidates: list[LlamaCppCandidate]) -> LlamaCppCandidate | None:
    """The fitting candidate with the fewest concessions, then the longest context."""
    fitting = [c for c in candidates if c.fits]
    return min(fitting, key=lambda c: (c.level, -c.n_ctx)) if fitting else None
