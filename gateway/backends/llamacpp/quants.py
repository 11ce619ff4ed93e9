"""Choosing among a model's GGUF quantizations by fit: each one's ladder is evaluated on this machine,
each one's best placement found, and the winner is the best of those by the plan's objective
(``gateway/backends/objective.py``), as for every engine: the floor, then nothing in RAM beside GPUs, at least
4 bits per weight and an acceptable speed, then context up to the target, then bits per weight, then
the estimated speed. So a smaller quantization with every layer on the GPUs beats a larger one with
experts in RAM, and more context beats more bits.

A pinned quantization (``--quant Q5_K_M`` or a file name) is the only one evaluated. Every
alternative is kept with its figures (file, size, layers on GPU, context, tokens/s) for ``plan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.backends import objective
from gateway.backends.llamacpp.ladder import LlamaCppCandidate, best

ACCEPTABLE_TOKENS_PER_S = objective.ACCEPTABLE_TOKENS_PER_S


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
        turn = {"warm_turn_tokens": c.warm_turn.tokens} if c is not None and c.warm_turn else {}
        return {
            "file": self.label,
            "quant": self.quant,
            "size_bytes": self.size,
            "fits": c is not None,
            "layers_on_gpu": self.gpu_layers,
            "layers": self.layers,
            "n_ctx": c.n_ctx if c else None,
            "kv_type": c.kv_type if c else None,
            "tokens_per_s_estimate": round(c.tokens_per_s, 1) if c else None,
            # what the objective ranks its precision by: 16 in the model's own format, else the file's
            # bytes over its weights (its name's figure when no tensor table was read)
            "bits_per_weight": c.weight_bits if c else None,
            "chosen": chosen,
            **turn,  # a model whose cache cannot roll back: what a later turn prefills again (issue 42)
        }

    def row(self, chosen: bool) -> str:
        """One line: its best placement by the plan's objective and what it gives up, or "does not fit"."""
        mark = "=>" if chosen else "ok" if self.candidate else "--"
        c = self.candidate
        head = f"  {mark} {self.quant or '?'} ({self.size / 1e9:.1f} GB): "
        if c is None:
            return head + "does not fit"
        figures = f"{c.where}, context {c.n_ctx:,}, KV {c.kv_type}, ~{c.tokens_per_s:,.0f} tokens/s"
        lost = [s for s in c.traits.shortfalls() if s != "weights in RAM"]
        return head + figures + (f" (gives up: {', '.join(lost)})" if lost else "")


def alternative(label: str, quant: str, size: int, candidates: list[LlamaCppCandidate], layers: int) -> Alternative:
    return Alternative(label, quant, size, best(candidates), layers)


def choose(alternatives: list[Alternative]) -> tuple[int | None, str]:
    """(index of the winner, why it won, in one line), or (None, why none fits)."""
    fitting = [i for i, a in enumerate(alternatives) if a.candidate is not None]
    if not fitting:
        return None, "no quantization fits in the GPUs and RAM"

    def traits(i: int) -> objective.Traits:
        candidate = alternatives[i].candidate
        assert candidate is not None
        return candidate.traits

    order = objective.ranked(sorted(fitting, key=lambda i: -alternatives[i].size), traits)
    winner = order[0]
    runner_up = order[1] if len(order) > 1 else None
    if runner_up is None:
        return winner, f"{alternatives[winner].quant}: the only quantization that fits"
    others = len(fitting) - 1
    line = objective.why(traits(winner), traits(runner_up), alternatives[runner_up].quant)
    return winner, f"{alternatives[winner].quant}: {line} ({others} other{'s' if others != 1 else ''} fit)"
