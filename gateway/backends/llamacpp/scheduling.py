"""What llama-server (b11434) does for many agent sessions at once, and how the gateway asks it.

llama-server has no scheduler of its own beyond its slots: each step it batches every generating slot's
next token, then fills the rest of the batch (``-b``) with prompt tokens, slot by slot in slot order
(tools/server/server-context.cpp:3325-3345, 3781). A slot with a long prompt left takes the whole
batch, and a slot after it in that order waits until the long prompt is done: a warm 100-token turn
waited the whole of another session's 20k-token prefill. Two means follow from this, and a third on request:

- **One long prefill at a time** (the gateway's long-prefill lane): the other slots stay free for warm
  turns, and several long prompts prefilled side by side finish no sooner than one after another.
- **The long prefill in the last slot**: a request's ``id_slot`` picks its slot (server-context.cpp:1686,
  4674); the long one goes to the last, so a warm turn in any other slot comes first in every batch and
  waits one batch, not the long prompt. Only once that slot is idle: pinned to a busy slot, b11434 finds
  no idle slot like it, so it saves the busy slot's prompt and loads the cache's best match for the new
  request into it (get_available_slot, server-context.cpp:1686-1790: f_keep 0) while the slot still works
  on its own request, and only then defers the new one; the slot then re-processes a prompt it never
  finishes (``progress = 1.11``, for ever: twice at 16 sessions, the second long prompt pinned to the slot
  the first still answered in). So the gateway reads ``/slots`` until the last slot is idle and every
  request it has in the engine holds a slot (none on its way that could take the last one first), and
  sends nothing else until ``/slots`` shows the long one there (:class:`gateway.backends.base.LongPin`);
  after 30 s of waiting it goes unpinned (llama-server then picks an idle slot, or waits for one). A
  short request is never pinned, so it still goes to the slot, or restores from the host-RAM cache, that
  holds its prefix (``--slot-prompt-similarity``). A long one whose start the engine likely holds (a later
  turn that adds a file of 3,000 tokens to a 20k-token conversation; a subagent's first turn, its parent's
  system prompt and tools held) finds the last slot empty more often than not (``--kv-unified`` empties
  every idle slot once another task starts, :2640-2657), and pinned to an empty slot b11434 skips the
  host-RAM cache (the slot's ``f_keep`` is 0/0, NaN, so no cache update, :1709-1741) and prefills the whole
  prompt again (measured: a 14,082-token prompt whose first 9,391 tokens were in the cache, 0 cached
  pinned, 9,391 unpinned). Unpinned it loads its start, but into whichever slot llama-server picks (the
  least recently used: slot 0, say), where every warm turn in a later slot waits for its whole prefill.
  So the gateway first runs a few tokens of its own in the empty last slot (:data:`PRIMER`, ~10 ms): a
  prompt pinned to a slot holding tokens it does not share is looked up in the cache (f_keep 0 < 0.5,
  :1731-1741), and loads its start there (measured by hand: 0 of 8,114 cached pinned to the empty slot,
  8,114 after the primer). The primer's own entry in the cache shares at most a token with any prompt,
  under the 25 % of its tokens a load needs (server-task.cpp:1818), so it is never loaded.
- **A small batch per step**: ``-b`` is what one step may hold (server-context.cpp:3321-3326, 3781: the
  generating slots' tokens, then prompt tokens until the batch is full; ``-ub`` follows it down,
  src/llama-context.cpp:250), so a warm turn beside a long prompt waits, at its prompt and at every
  token it decodes, for a step that carries up to ``-b`` tokens of that prompt. On one GPU ``-b 512``,
  one ubatch a step (the default ``-b 2048`` computes four ubatches before anyone's next token: 4.1 s
  against 1.4 s for a warm turn's 8-token answer beside a 20k-token prefill here, the prefill ~12 %
  slower). On the CPU ``-b 64``: the CPU backend's flash attention runs tiled from 64 query rows up
  (ggml-cpu/ops.cpp:9546, GGML_FA_TILE_Q 64 in ggml-cpu/common.h), so a 19k-token prefill takes the
  same CPU time as with 512 (7.2 s against 8.0 s here; 21 s with 32; measured on a dense model: an
  MoE's experts each see fewer of a step's tokens, not measured), while a warm turn's 8-token answer
  beside eight cold 20k-token prompts went from 17-37x its time alone to 3.1x for the first turn and
  4-7x for later ones, deeper into the prefills (benchmarks/agent_load.py --fairness --burst-turns 6;
  docs/many-agents.md). A step
  must also hold every generating slot's draft: llama-server aborts when they do not fit
  (server-context.cpp:576), and one n-gram draft is up to 64 tokens, so with ``-b 64`` each slot
  drafts at most 15 (4 slots x 16 = 64; backends.llamacpp.drafting.step_bound). No
  memory term grows: compute buffers are sized for the ubatch (src/llama-context.cpp reserves
  n_ubatch). Across several devices the default stays: there a call's ubatches are pipelined from
  device to device (llama-context.cpp:432-459), which one ubatch per call would give up (not measured
  here).
- **A long prefill that pauses for warm turns** (``--pause-long-prefills``, off by default): no batch
  size keeps both the prefill's speed and a warm turn's decode beside it (each of its steps carries ``-b``
  tokens of the long prompt, costlier the deeper that prompt is: 4-7x its time alone at ``-b 64``), and
  llama-server cannot pause a prompt. But a request cancelled mid-prefill leaves what it prefilled in its
  slot (a cancel releases the slot, server-context.cpp:2659-2667, after the tokens of each batch went into
  the slot's cache, :3817), and a new task saves an idle slot to the host-RAM cache before clearing it
  (``--cache-idle-slots``, on by default: :2640-2657), from which an unpinned request with the same prompt
  loads it back (get_available_slot, :1745-1790). So the gateway can prefill a long prompt as a request of
  its own (:data:`PREFILL_FIRST`: one token, streamed with ``return_progress``, an event per batch, so the
  HTTP thread sees the closed connection within a batch, :4138; without events it looks once a second,
  :40), close it while warm turns run and send it again after, in the idle slot that still holds what it
  did (:func:`slot_holding`), else in the last slot primed as above (where a new task has saved it to the
  RAM cache and cleared its slot; sent unpinned, it had gone to the least recently used slot, and a warm
  turn after it waited its whole run); the client's own request then finds its prompt cached (measured:
  cancelled at 2,496 of 8,022 tokens, resumed with 2,560 cached, the request itself prefilled 1 token).
  Off by default: a paused engine decodes warm turns alone and every resume sends the prompt again, so many
  sessions' cold first turns at once take longer (16 sessions, one core each: ~8 % less output on one
  engine, ~21 % on two replicas; docs/many-agents.md).
A request's place in the queue is the gateway's (gateway/serving/scheduling/admission.py); llama-server itself
takes them in arrival order and defers one whose slot is busy (server-context.cpp:2603-2620).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import gateway.backends.llamacpp.drafting as drafting
from gateway.backends.base import LongPin, PrefillFirst, Primer, Scheduling
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.progress import SLOTS_PATH

GPU_BATCH = 512  # llama-server's -b on one GPU: one ubatch a step (b11434's default -ub)
CPU_BATCH = 64  # on the CPU: the fewest tokens a step whose attention still runs tiled (GGML_FA_TILE_Q)
OWN_BATCH = 2048  # llama-server's own -b (common.h n_batch)
# a long prefill whose start the engine likely holds, this many tokens or more, has an empty last slot
# primed before it is pinned there, so that it loads that start from the RAM cache (below it, it is pinned
# to the empty slot and prefills the start again: a prime and a load are not worth it)
HELD_TO_LOAD = 2048
PRIME = "gateway_prime"  # a placing's mark that asks for the primer, taken out before the request is sent
# two dozen tokens of which a chat prompt shares the BOS at most: the primer's cache entry is never loaded
PRIME_PROMPT = "(gateway: this slot is primed for a long prompt that the host-RAM cache holds the start of)"


def _prime_body(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    """Greedy, so that every primer leaves the same entry in the cache (a copy of one it holds is not saved)."""
    return {
        "prompt": PRIME_PROMPT,
        "n_predict": 1,
        "temperature": 0,
        "id_slot": fields["id_slot"],
        "cache_prompt": True,
    }


# a few tokens run in the empty last slot, so that the long prompt pinned there next loads its start
PRIMER = Primer(marker=PRIME, path="/completion", body=_prime_body)


def progress_figures(read: bytes) -> tuple[int, int, int] | None:
    """(total, cached, done) from the last ``prompt_progress`` event in ``read`` (``{"total", "cache",
    "processed", "time_ms"}``, server-task.cpp:242: ``processed`` counts the cached tokens too); None where
    it holds none."""
    for line in reversed(read.split(b"\n")):
        if not line.startswith(b"data:") or b"prompt_progress" not in line:
            continue
        try:
            progress = json.loads(line[5:]).get("prompt_progress")
        except (ValueError, AttributeError):
            continue
        if not isinstance(progress, dict):
            continue
        total, cached, done = progress.get("total"), progress.get("cache"), progress.get("processed")
        if _count(total) and _count(cached) and _count(done):
            return total, cached, done
    return None


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


RESUME_SLACK = OWN_BATCH  # a cancel lands at the next event: a slot holds at most a batch more than the last said


def slot_holding(slots_page: str, done: int) -> dict[str, Any]:
    """``{"id_slot": n}`` for the idle slot that still holds a paused prefill's ``done`` tokens (between them and
    a batch more; the closest), so that it resumes there rather than wherever llama-server's similarity puts it
    (another session's slot sharing its start, whose own tail would be lost unsaved: f_keep >= 0.5 keeps no
    copy, get_available_slot). Where none does (a new task saved it to the RAM cache and cleared the slot,
    :2640-2657), the last slot primed (:data:`PRIMER`) if it is idle and empty, so that it loads them back
    there; {} otherwise (unpinned: llama-server loads it wherever it puts it)."""
    slots = _slot_tokens(slots_page)
    holding = [(tokens - done, number) for number, (busy, tokens) in slots.items() if not busy]
    holding = [(extra, number) for extra, number in holding if done > 0 and 0 <= extra <= RESUME_SLACK]
    if holding:
        return {"id_slot": min(holding)[1]}
    last = max(slots, default=None)
    if done > 0 and last is not None and slots[last] == (False, 0):
        return {"id_slot": last, PRIME: True}
    return {}


# the prefill of a long prompt as the gateway's own request: one token, an event per batch, sent again
# unpinned after a pause (the answer's length and count, and a stream's options, are the client's request's)
PREFILL_FIRST = PrefillFirst(
    fields={"stream": True, "return_progress": True, "max_tokens": 1},
    drop=("id_slot", "stream_options", "max_completion_tokens", "n_predict", "n", "logprobs", "top_logprobs"),
    paths=frozenset({"/v1/chat/completions", "/v1/completions"}),
    progress=progress_figures,
    path=SLOTS_PATH,
    resume=slot_holding,
)

BATCH_FLAGS = frozenset({"-b", "--batch-size", "-ub", "--ubatch-size"})


@dataclass(frozen=True)
class Batch:
    """The plan's ``-b`` for many sessions (``argv``), the tokens one step then holds, the bound on a
    draft that keeps every slot's draft inside that step (``draft_argv``, backends.llamacpp.drafting)
    and the reason the plan gives for both."""

    argv: tuple[str, ...]
    why: str
    tokens: int
    draft_argv: tuple[str, ...] = ()


def batch(
    devices: int,
    *,
    on_cpu: bool,
    given: list[str] | tuple[str, ...] = (),
    draft: str | None = None,
    slots: int = NATIVE.slots,
) -> Batch:
    """``-b`` for many sessions: 64 tokens a step on the CPU, one ubatch on one GPU, llama-server's own
    across several devices or when the user's own llama-server command (``given``) sets a batch size;
    with ``draft``, the draft bounded so that ``slots`` slots' sampled tokens and drafts fit a step."""
    if any(word.split("=")[0] in BATCH_FLAGS for word in given):
        chosen = Batch((), "batch: as your llama-server command sets it", _given_batch(given))
    elif devices > 1:
        chosen = Batch((), "batch: llama-server's own (its ubatches are pipelined across the devices)", OWN_BATCH)
    elif on_cpu:
        why = (
            f"batch: -b {CPU_BATCH} on the CPU: a warm turn's every step waits for at most {CPU_BATCH} tokens "
            f"of a long prompt beside it (attention runs tiled from {CPU_BATCH} tokens a step: the prefill "
            "loses nothing)"
        )
        chosen = Batch(("-b", str(CPU_BATCH)), why, CPU_BATCH)
    else:
        why = (
            f"batch: -b {GPU_BATCH} on one GPU: a warm turn's every step waits for at most one ubatch of a long prompt"
        )
        chosen = Batch(("-b", str(GPU_BATCH)), why, GPU_BATCH)
    if draft is None:
        return chosen
    bound = drafting.step_bound(draft, chosen.tokens, slots, given)
    if not bound.argv:
        return chosen
    why = (
        f"{chosen.why}; drafts of at most {bound.tokens} tokens, not {drafting.ARGV[draft][1]}'s "
        f"{drafting.DRAFT_TOKENS[draft]}: {slots} slots' tokens and drafts must fit one {chosen.tokens}-token step"
    )
    return Batch(chosen.argv, why, chosen.tokens, bound.argv)


def _given_batch(given: list[str] | tuple[str, ...]) -> int:
    """The ``-b`` a user's llama-server command sets (``-b N``, ``--batch-size=N``); llama-server's own when
    it sets only ``-ub``."""
    for i, word in enumerate(given):
        flag, _, value = word.partition("=")
        if flag in ("-b", "--batch-size"):
            value = value or (given[i + 1] if i + 1 < len(given) else "")
            if value.isdigit():
                return int(value)
    return OWN_BATCH


def scheduling(slots: int, batch_why: str = "") -> Scheduling:
    """The gateway's means on ``slots`` slots; ``batch_why``: the plan's batch size and its reason."""
    if slots < 2:  # one slot: nothing runs beside a long prefill
        return Scheduling(means="one slot: requests in turn")
    batch_part = f"; {batch_why}" if batch_why else ""
    return Scheduling(
        long_lane=1,
        long_pin=LongPin(SLOTS_PATH, place_in_last_slot, slot_taken, primer=PRIMER),
        prefill_first=PREFILL_FIRST,
        means=f"{slots} slots; one long prefill at a time, in slot {slots - 1} once idle (warm turns are batched "
        "first)" + batch_part,
    )


def place_in_last_slot(slots_page: str, others: int, held: int = 0) -> dict[str, Any] | None:
    """``{"id_slot": last}`` once ``GET /slots`` shows the last slot idle and at least ``others`` slots busy
    (each of the gateway's other requests in the engine holds one: none is on its way to take the last
    first); None: not yet; {}: not the slots list. Where the last slot is empty while the engine likely
    holds ``held`` tokens of the prompt, :data:`HELD_TO_LOAD` or more, the slot is primed first
    (:data:`PRIMER`: pinned to an empty slot it would not load them)."""
    slots = _slot_tokens(slots_page)
    if not slots:
        return {}
    last = max(slots)
    if slots[last][0] or sum(busy for busy, _tokens in slots.values()) < others:
        return None
    return {"id_slot": last, PRIME: True} if held >= HELD_TO_LOAD and not slots[last][1] else {"id_slot": last}


def slot_taken(slots_page: str, fields: Mapping[str, Any]) -> bool:
    """Whether ``GET /slots`` shows the pinned slot processing: the long request holds it."""
    slots = _slots(slots_page)
    return bool(slots) and slots.get(fields.get("id_slot", -1)) is True


def _slots(slots_page: str) -> dict[int, bool]:
    """Each slot's id and whether it is processing, from ``GET /slots``; {} for anything else."""
    return {number: busy for number, (busy, _tokens) in _slot_tokens(slots_page).items()}


def _slot_tokens(slots_page: str) -> dict[int, tuple[bool, int]]:
    """Each slot's id, whether it is processing and the tokens it holds (``n_prompt_tokens``: its prompt and
    what it generated, server-context.cpp:724; 0 where not said), from ``GET /slots``; {} for anything else."""
    try:
        listed = json.loads(slots_page)
    except ValueError:
        return {}
    if not isinstance(listed, list):
        return {}
    slots = {}
    for slot in listed:
        number = slot.get("id") if isinstance(slot, dict) else None
        processing = slot.get("is_processing") if isinstance(slot, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or not isinstance(processing, bool):
            return {}
        tokens = slot.get("n_prompt_tokens")
        slots[number] = (processing, tokens if _count(tokens) else 0)
    return slots
