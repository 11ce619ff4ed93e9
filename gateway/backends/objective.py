"""The one objective every plan is ranked by: the rungs of vLLM's ladder, the placements of
llama.cpp's, the choice among a model's GGUF quantizations and the choice of engine all sort by
:func:`key`. Each engine describes a candidate in engine-neutral :class:`Traits`; nothing here knows
an engine.

For serving coding agents, in this order (README "Plan it" gives the reasons):

1. **floor**: context at least the floor (65,536 by default, the model's maximum when smaller). A
   candidate below it is a last resort, ranked after every one that reaches it (and said loudly);
2. **no fragile settings**: weights in host RAM beside GPUs (CPU offload), a GGUF below 4 bits per
   weight, utilization above the release's default, eager mode, fewer than :data:`MIN_SEQUENCES`
   sequences, each ranked below any candidate without it, most severe first: so a pre-quantized
   checkpoint or a smaller GGUF quantization comes before any of them (the engines offer only
   checkpoints from the model's own organisation or a known quantizer). What the user pinned is
   never counted: they asked for it;
2b. **warm turns**: a later turn of an agent's session that prefills again at least
   :data:`COLD_TURN_TOKENS` of the previous prompt (an engine that cannot resume a hybrid model's
   recurrent state near the prompt's end) ranks after every candidate that keeps turns warm: an
   agent pays that prefill on every tool call, so it decides between engines before context or speed;
3. **target**: more context, up to the target (131,072 by default, the model's maximum when smaller),
   in steps of :data:`CONTEXT_STEP`; then an estimated decode under :data:`ACCEPTABLE_TOKENS_PER_S`
   ranks after every faster one (the slower, the later), so that precision never buys a crawl
   (a BF16 GGUF at 2 tokens/s from RAM before a 4-bit one at 8);
4. **precision**: weight bits (BF16 16 > FP8 > INT8/W8A16 > FP4/INT4/AWQ; a GGUF by its bits per
   weight), then the KV cache's where it loses precision (vLLM's fp8 KV: one scale per tensor;
   llama.cpp's q8_0 KV keeps a scale per 32 values and is priced by speed alone);
5. **speed**: the engine's own decode estimate (llama.cpp's KV type and expert placement included);
   then the engine's own tie-break (vLLM: more sequences), then the longer context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from gateway.core.policy import Goal

ACCEPTABLE_TOKENS_PER_S = 10.0  # below this an agent's turn of a few hundred tokens takes minutes
MIN_SEQUENCES = 4  # an agent runs subagents, titles and summaries beside its main request
CONTEXT_STEP = 8192  # contexts closer than this count as equal (vLLM sizes each rung to the token)
LOW_BITS = 4.0  # below this a GGUF's quality drops steeply
# a later turn that prefills this much of the previous prompt again is cold: at 1,000-5,000 tokens/s
# of prefill on a GPU (club-3090#1000) a second or more per tool call, and minutes from RAM or a CPU
COLD_TURN_TOKENS = 1024


@dataclass(frozen=True)
class Traits:
    """What one candidate gives and gives up, in the objective's terms."""

    goal: Goal
    context: int
    offload: bool = False  # weights in host RAM beside GPUs (vLLM --cpu-offload-gb; llama.cpp layers, experts)
    raised_utilization: bool = False  # above the release's default share of GPU memory
    eager: bool = False  # no CUDA graphs
    few_sequences: bool = False  # fewer than MIN_SEQUENCES (or the sessions asked for) at once
    weight_bits: float = 16.0
    kv_bits: float = 16.0  # only where the KV cache type loses precision
    tokens_per_s: float = 0.0  # estimated decode of one request; 0: not estimated
    drafting: bool = False  # an optional extra that costs nothing above (vLLM's MTP speculative decoding)
    # tokens of the previous prompt a later turn of the same session prefills again, at most (0: none
    # beyond what is new, or not worked out: only hybrid and sliding-window models differ by engine)
    turn_prefill: int = 0
    tie: tuple[float, ...] = ()  # the engine's own order between otherwise equal candidates (lower first)

    @property
    def below_floor(self) -> bool:
        return self.context < self.goal.floor

    @property
    def low_bit(self) -> bool:
        return self.weight_bits < LOW_BITS

    @property
    def cold_turns(self) -> bool:
        return self.turn_prefill >= COLD_TURN_TOKENS

    @property
    def slowness(self) -> float:
        """Tokens/s short of acceptable (0: acceptable or not estimated): the slower, the worse."""
        if not 0 < self.tokens_per_s < ACCEPTABLE_TOKENS_PER_S:
            return 0.0
        return round(ACCEPTABLE_TOKENS_PER_S - self.tokens_per_s, 1)

    def fragile(self) -> list[str]:
        """What it gives up that an agent's user would not, most severe first (step 2)."""
        named = [
            (self.offload, "weights in RAM"),
            (self.low_bit, f"{self.weight_bits:g} bits per weight"),
            (self.raised_utilization, "utilization above the default"),
            (self.eager, "eager mode"),
            (self.few_sequences, f"fewer than {max(MIN_SEQUENCES, self.goal.sessions)} sequences"),
        ]
        return [text for present, text in named if present]

    def shortfalls(self) -> list[str]:
        """Everything it misses of the objective, most important first: the floor, then step 2, then
        the target (for one line of why)."""
        out = [f"context {self.context:,} below the {self.goal.floor:,} floor"] if self.below_floor else []
        out += self.fragile()
        if self.cold_turns:
            out.append(self.cold_phrase)
        if not self.below_floor and self.context < self.goal.target:
            out.append(f"context {self.context:,} < {self.goal.target:,}")
        if self.slowness:
            out.append(f"~{self.tokens_per_s:.1f} tokens/s")
        return out

    @property
    def cold_phrase(self) -> str:
        return f"re-prefills up to {self.turn_prefill:,} tokens every turn"


def key(traits: Traits) -> tuple[float | int | bool, ...]:
    """The sort key: lower is better (the module docstring's order)."""
    t = traits
    return (
        t.below_floor,
        t.offload,
        t.low_bit,
        t.raised_utilization,
        t.eager,
        t.few_sequences,
        t.cold_turns,
        -(min(t.context, t.goal.target) // CONTEXT_STEP),
        t.slowness,
        -t.weight_bits,
        -t.kv_bits,
        not t.drafting,
        -round(t.tokens_per_s, 1),
        *t.tie,
        -t.context,
    )


def standing(traits: Traits) -> tuple[float | int | bool, ...]:
    """The objective's steps 1-4 (floor, fragile settings, warm turns, context up to the target, a crawl,
    precision): what decides between shapes of the same model on the same machine (one engine or several
    replicas, gateway/planning/replicas.py) before the sessions they keep warm and their aggregate decode,
    which replace step 5's one-request speed there."""
    return key(traits)[:11]


T = TypeVar("T")


def ranked(items: Iterable[T], traits: Callable[[T], Traits]) -> list[T]:
    """``items`` best first by the objective (stable: equal ones keep their order)."""
    return sorted(items, key=lambda item: key(traits(item)))


def why(chosen: Traits, runner_up: Traits | None = None, runner_up_name: str = "") -> str:
    """One line: what the choice reaches, and what the next best would give up to do better."""
    reach = f"context {chosen.context:,}"
    if chosen.below_floor:
        reach = f"context {chosen.context:,}, the longest below the {chosen.goal.floor:,} floor"
    elif chosen.context >= chosen.goal.target:
        reach += f" (the {chosen.goal.target:,} target reached)"
    else:
        reach += f" (≥ the {chosen.goal.floor:,} floor; nothing stable reaches {chosen.goal.target:,})"
    given_up = [s for s in chosen.shortfalls() if not s.startswith("context ")]
    if given_up:
        reach += "; gives up " + ", ".join(given_up)
    if runner_up is None or not runner_up_name:
        return reach
    lost = lost_on(chosen, runner_up)
    return f"{reach}; {runner_up_name}: {lost}" if lost else reach


def lost_on(chosen: Traits, other: Traits) -> str:
    """Why ``other`` ranks after ``chosen``: the first step of the objective where it is worse."""
    if other.below_floor and not chosen.below_floor:
        return f"context {other.context:,} below the {other.goal.floor:,} floor"
    mine, theirs = chosen.fragile(), other.fragile()
    if key(other)[1:6] > key(chosen)[1:6]:
        extra = [s for s in theirs if s not in mine] or theirs
        return "needs " + ", ".join(extra)
    if other.cold_turns and not chosen.cold_turns:
        return other.cold_phrase
    if min(other.context, other.goal.target) // CONTEXT_STEP < min(chosen.context, chosen.goal.target) // CONTEXT_STEP:
        return f"context {other.context:,} only"
    if other.slowness > chosen.slowness:
        return f"too slow (~{other.tokens_per_s:.1f} tokens/s)"
    if (other.weight_bits, other.kv_bits) < (chosen.weight_bits, chosen.kv_bits):
        return f"less precise ({other.weight_bits:g} bits per weight" + (
            f", {other.kv_bits:g}-bit KV)" if other.kv_bits < chosen.kv_bits else ")"
        )
    if other.tokens_per_s < chosen.tokens_per_s:
        return f"slower (~{other.tokens_per_s:,.0f} tokens/s)"
    return ""
