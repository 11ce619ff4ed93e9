"""What vLLM does for many agent sessions at once, and how the gateway asks it (vLLM 0.32 source).

- **Chunked prefill with a cap per long prompt.** Each engine step has a token budget
  (``--max-num-batched-tokens``); RUNNING requests are scheduled first, so eight cold 20k-token prompts
  would take every step's whole budget and a warm turn waiting behind them gets none
  (v1/core/sched/scheduler.py:657-712). ``--long-prefill-token-threshold`` caps what one prompt takes of
  a step (scheduler.py:708): a quarter of the budget here, so two long prefills leave half of every
  step to warm turns and decodes. vLLM lifts the cap when a prompt is alone (scheduler.py:642-648).
- **Priority scheduling.** ``--scheduling-policy priority`` orders the waiting queue by each request's
  ``priority`` (lower first; 0 by default) and preempts the lowest first when KV runs short
  (scheduler.py:795-800). The gateway sends a long prefill with priority 1, so warm turns (0) go first.
  The chat, completions and Responses routes take the field (openai/responses/protocol.py:327); vLLM's
  own Messages route ignores it (anthropic/protocol.py builds its chat request without it), so a
  Claude Code request passed through keeps priority 0 and relies on the cap and on the gateway's lane.
- The gateway's long-prefill lane is two: two capped long prefills take half a step's budget.
"""

from __future__ import annotations

from backends.base import Scheduling

LONG_PREFILL_SHARE = 4  # a long prompt takes at most 1/4 of a step's token budget
LONG_LANE = 2  # long prefills at once: together half of a step's budget
LONG_PRIORITY = 1  # after warm turns (vLLM's default priority is 0; lower goes first)


def long_prefill_threshold(max_num_batched_tokens: int, max_model_len: int) -> int:
    """``--long-prefill-token-threshold``: a quarter of the step budget, at least one 16-token block, never
    past the context (vLLM refuses a threshold above max_model_len: config/scheduler.py:352)."""
    return min(max(max_num_batched_tokens // LONG_PREFILL_SHARE, 16), max_model_len)


def scheduling(max_num_batched_tokens: int, max_model_len: int) -> Scheduling:
    threshold = long_prefill_threshold(max_num_batched_tokens, max_model_len)
    return Scheduling(
        long_lane=LONG_LANE,
        long_fields={"priority": LONG_PRIORITY},
        means=(
            f"priority scheduling (long prefills at priority {LONG_PRIORITY}), each long prompt capped at "
            f"{threshold:,} of a step's {max_num_batched_tokens:,} tokens, {LONG_LANE} long prefills at once"
        ),
    )
