"""Choosing among a model's GGUF quantizations by fit: each one's ladder is evaluated on this machine,
and the winner is

1. the largest whose every layer is on the GPUs at the minimum context (or longer): nothing waits for
   host memory, and more bits per weight is more quality;
2. otherwise the one keeping the most layers on the GPUs among those whose estimated decode speed is
   acceptable (:data:`ACCEPTABLE_TOKENS_PER_S`), the larger between equals; when none is acceptable,
   the fastest. Here types below 4 bits count only when nothing of 4 bits or more fits: with layers in
   RAM anyway, a few more on the GPU is not worth the quality a 2- or 3-bit file loses.

A pinned quantization (``--quant Q5_K_M`` or a file name) is the only one evaluated. Every
alternative is kept with its figures (file, size, layers on GPU, context, tokens/s) for ``plan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.llamacpp.ladder import LlamaCppCandidate, best

ACCEPTABLE_TOKENS_PER_S = 10.0  # below this an agent's turn of a few hundred tokens takes minutes


@dataclass(frozen=True)
class Alternative:
    """One quantization's best placement on this machine (or why it has none)."""

    label: str  # repo/file
    quant: str
    size: int
    candidate: LlamaCppCandidate | None
    layers: int  # the model's blocks + output

    @property
    def gpu_layers(self) -> int:
        """Blocks whose weights all sit on a GPU (experts kept in RAM count as not on the GPU)."""
        c = self.candidate
        if c is None:
            return 0
        return max(0, min(c.placement.n_gpu_layers, self.layers) - c.placement.n_cpu_moe)

    @property
    def all_on_gpus(self) -> bool:
        return self.candidate is not None and self.candidate.all_on_gpus and self.candidate.placement.n_gpu_layers > 0

    def to_json(self, chosen: bool) -> dict[str, Any]:
        c = self.candidate
        return {
            "file": self.label,
            "quant": self.quant,
            "size_bytes": self.size,
            "fits": c is not None,
            "layers_on_gpu": self.gpu_layers,
            "layers": self.layers,
            "n_ctx": c.n_ctx if c else None,
            "tokens_per_s_estimate": round(c.tokens_per_s, 1) if c else None,
            "chosen": chosen,
        }

    def row(self, chosen: bool) -> str:
        mark = "=>" if chosen else "ok" if self.candidate else "--"
        c = self.candidate
        figures = (
            f"{self.gpu_layers}/{self.layers} layers on GPU, ctx {c.n_ctx:,}, ~{c.tokens_per_s:,.1f} tokens/s"
            if c
            else "does not fit"
        )
        return f"  {mark:2}{self.quant or '?':8} {self.size / 1e9:6.2f} GB  {figures}  {self.label}"


def alternative(label: str, quant: str, size: int, candidates: list[LlamaCppCandidate], layers: int) -> Alternative:
    return Alternative(label, quant, size, best(candidates), layers)


LOW_BIT = ("Q2", "Q3", "IQ1", "IQ2", "IQ3", "TQ")  # below 4 bits/weight: quality drops steeply


def low_bit(quant: str) -> bool:
    return quant.upper().startswith(LOW_BIT)


def choose(alternatives: list[Alternative]) -> tuple[int | None, str]:
    """(index of the winner, why it won), or (None, why none fits). When none fits wholly on the GPUs,
    quantizations below 4 bits are considered only if none of 4 bits or more fits."""
    fitting = [i for i, a in enumerate(alternatives) if a.candidate is not None]
    if not fitting:
        return None, "no quantization fits in the GPUs and RAM"
    others = len(fitting) - 1
    on_gpus = [i for i in fitting if alternatives[i].all_on_gpus]
    if on_gpus:
        winner = max(on_gpus, key=lambda i: alternatives[i].size)
        return winner, (
            f"{alternatives[winner].quant}: the largest quantization with every layer on the GPUs"
            + (f" ({others} other{'s' if others != 1 else ''} fit{'s' if others == 1 else ''})" if others else "")
        )

    def speed(i: int) -> float:
        c = alternatives[i].candidate
        return c.tokens_per_s if c else 0.0

    if any(not low_bit(alternatives[i].quant) for i in fitting):  # partly in RAM: quality before layers
        fitting = [i for i in fitting if not low_bit(alternatives[i].quant)]

    acceptable = [i for i in fitting if speed(i) >= ACCEPTABLE_TOKENS_PER_S]
    if acceptable and not any(alternatives[i].gpu_layers for i in fitting):  # no GPU: RAM decides, and speed
        winner = max(acceptable, key=lambda i: alternatives[i].size)
        return winner, (
            f"{alternatives[winner].quant}: no layer on a GPU; the largest that fits in RAM at an acceptable "
            f"speed (~{speed(winner):.1f} ≥ {ACCEPTABLE_TOKENS_PER_S:g} tokens/s)"
        )
    if acceptable:
        winner = max(acceptable, key=lambda i: (alternatives[i].gpu_layers, alternatives[i].size))
        a = alternatives[winner]
        return winner, (
            f"{a.quant}: no quantization fits entirely on the GPUs; the most layers on the GPUs "
            f"({a.gpu_layers}/{a.layers}) at an acceptable speed (~{speed(winner):.1f} ≥ {ACCEPTABLE_TOKENS_PER_S:g} "
            "tokens/s), the larger between equals"
        )
    winner = max(fitting, key=speed)
    return winner, (
        f"{alternatives[winner].quant}: none reaches {ACCEPTABLE_TOKENS_PER_S:g} tokens/s; the fastest "
        f"(~{speed(winner):.1f} tokens/s)"
    )
