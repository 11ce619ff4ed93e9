"""What llama-server (b11434) does for many agent sessions at once, and how the gateway asks it.

llama-server has no scheduler of its own beyond its slots: each step it batches every generating slot's
next token, then fills the rest of the batch (``-b``) with prompt tokens, slot by slot in slot order
(tools/server/server-context.cpp:3325-3345, 3781). A slot with a long prompt left takes the whole
batch, and a slot after it in that order waits until the long prompt is done: a warm 100-token turn
waited the whole of another session's 20k-token prefill. Two means follow from this:

- **One long prefill at a time** (the gateway's long-prefill lane): the other slots stay free for warm
  turns, and several long prompts prefilled side by side finish no sooner than one after another.
- **The long prefill in the last slot**: a request's ``id_slot`` picks its slot (server-context.cpp:1686,
  4674); the long one goes to the last, so a warm turn in any other slot comes first in every batch and
  waits one batch, not the long prompt. The pinned slot skips the host-RAM cache restore
  (server-context.cpp:1694-1745: with ``id_slot`` set, only that slot's own tokens are reused), which
  costs nothing for a prompt the engine does not hold; a short request is never pinned, so it still goes
  to the slot, or restores from the cache, that holds its prefix (``--slot-prompt-similarity``).
- **One ubatch per step on one device** (``-b 512``, the ubatch): a long prompt beside a warm turn then
  adds at most 512 tokens to each of the warm turn's steps, prompt and every decoded token alike (the
  default ``-b 2048`` computes four ubatches before anyone's next token: 4.1 s against 1.4 s for a warm
  turn's 8-token answer beside a 20k-token prefill here, the prefill ~12 % slower). No memory term
  changes: compute buffers are sized for the ubatch (src/llama-context.cpp reserves n_ubatch).
  Across several devices the default stays: there a call's ubatches are pipelined from device to
  device (llama-context.cpp:432-459), which one ubatch per call would give up (not measured here).
A request's place in the queue is the gateway's (gateway/serving/scheduling/admission.py); llama-server itself
takes them in arrival order and defers one whose slot is busy (server-context.cpp:2603-2620).
"""

from __future__ import annotations

from gateway.backends.base import Scheduling

INTERACTIVE_BATCH = 512  # llama-server's -b on one device: the ubatch (b11434's default -ub)


BATCH_FLAGS = frozenset({"-b", "--batch-size", "-ub", "--ubatch-size"})


def batch_argv(devices: int, given: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``-b`` for many sessions: one ubatch per step on one device (CPU or one GPU), the default across
    several; none when the user's own llama-server command (``given``) sets a batch or ubatch size."""
    if devices > 1 or any(word.split("=")[0] in BATCH_FLAGS for word in given):
        return []
    return ["-b", str(INTERACTIVE_BATCH)]


def scheduling(slots: int) -> Scheduling:
    if slots < 2:  # one slot: nothing runs beside a long prefill
        return Scheduling(means="one slot: requests in turn")
    return Scheduling(
        long_lane=1,
        long_fields={"id_slot": slots - 1},
        means=f"{slots} slots; one long prefill at a time, in slot {slots - 1} (warm turns are batched first)",
    )
