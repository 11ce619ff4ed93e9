"""What llama-server keeps of past prompts so that an agent's next turn prefills only what is new,
sized by the plan and counted in its RAM.

A coding agent resends its whole conversation every turn (20-100k tokens). llama-server reuses what
a slot's cache still holds of it; what the plan sets on purpose here decides how long that lasts
when several sessions, side requests and subagents share the four slots:

- ``--cache-ram``: a slot's prompt is saved to a host-RAM cache before another request takes the
  slot, and restored from there when its session comes back (b11434's default is 8 GiB whatever the
  machine has, uncounted). The plan gives it half the RAM its own terms and margin leave, at most
  what four full-context prompts hold (one per slot: more is rarely asked back), and none below
  256 MiB unless that is all four need (a small model's). With ``--kv-unified`` the slots share one
  context: two 20k-token sessions do not both fit in 32k, so a session another one evicted comes back
  only from this cache (measured: without it every interleaved turn prefilled its whole prompt).
- ``--ctx-checkpoints``: a model with sliding-window or recurrent layers cannot roll those back to
  an earlier position, so without a checkpoint of their state near the end of the previous prompt it
  prefills the whole conversation again (ggml-org/llama.cpp#22746). Each checkpoint is one slot's
  sliding-window cache or recurrent state, kept in RAM. b11434 keeps up to 32 per slot, uncounted; a
  turn makes two or three (at its last user message and just before the prompt's end) and the next
  turn needs the latest, so the plan keeps up to 8 per slot, as many as the RAM left allows, counted.
- ``--cache-reuse``: chunks of at least 256 tokens found again further on (an agent that dropped or
  edited an earlier message) are shifted into place instead of prefilled, where the model's cache
  can shift (llama-server turns it off by itself where it cannot).
- ``--slot-prompt-similarity``: a request goes to the slot whose prompt it extends most (above 10 %
  of the prompt, b11434's own threshold, set here so that it stays), else to the least recently used
  one; that is how a session's turns keep landing on the slot that holds its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llamacpp.gguf_facts import GgufFacts
from backends.llamacpp.placement import (
    NATIVE_PARALLEL,
    UBATCH,
    is_sliding,
    kv_bytes_per_token_layer,
    recurrent_state_bytes,
)
from gateway.core.devices import GIB, MIB

SLOTS = NATIVE_PARALLEL  # llama-server's -np
MIN_CACHE_BYTES = 256 * MIB
MAX_CHECKPOINTS = 8  # per slot (b11434's default is 32): the last few turns' checkpoints
CACHE_REUSE_TOKENS = 256
SLOT_SIMILARITY = 0.10


@dataclass(frozen=True)
class WarmSessions:
    """The prompt cache in RAM and the context checkpoints per slot, with what they cost in RAM."""

    cache_ram_bytes: int = 0
    checkpoints: int = 0  # per slot; 0 where the model has no layer that needs them
    checkpoint_bytes: int = 0  # one checkpoint of one slot

    @property
    def host_bytes(self) -> int:
        return self.cache_ram_bytes + SLOTS * self.checkpoints * self.checkpoint_bytes

    def argv(self) -> list[str]:
        argv = ["--cache-ram", str(self.cache_ram_bytes // MIB), "--cache-reuse", str(CACHE_REUSE_TOKENS)]
        argv += ["--slot-prompt-similarity", f"{SLOT_SIMILARITY:g}"]
        return [*argv, "--ctx-checkpoints", str(self.checkpoints)]

    def phrase(self) -> str:
        """The plan's reason: "; prompt cache 4.0 GiB in RAM, 8 checkpoints/slot (1.2 GiB)"."""
        cache = (
            f"prompt cache {self.cache_ram_bytes / GIB:.1f} GiB in RAM" if self.cache_ram_bytes else "no prompt cache"
        )
        held = SLOTS * self.checkpoints * self.checkpoint_bytes
        return f"; {cache}" + (f", {self.checkpoints} checkpoints/slot ({held / GIB:.1f} GiB)" if held else "")


def size(spare_bytes: int, kv_bytes: int, checkpoint_bytes: int) -> WarmSessions:
    """Fit the caches into ``spare_bytes`` of RAM (what the plan's own terms and margin leave):
    checkpoints first (without them a sliding-window or recurrent model re-prefills everything),
    then half of the rest for the prompt cache, at most four times the KV cache."""
    spare = max(spare_bytes, 0)
    checkpoints = 0
    if checkpoint_bytes:
        checkpoints = min(MAX_CHECKPOINTS, spare // 2 // (SLOTS * checkpoint_bytes))
        spare -= checkpoints * SLOTS * checkpoint_bytes
    wanted = SLOTS * kv_bytes
    cache = min(spare // 2, wanted)
    cache = cache // MIB * MIB if cache >= min(MIN_CACHE_BYTES, wanted) and cache >= MIB else 0
    return WarmSessions(cache, checkpoints, checkpoint_bytes if checkpoints else 0)


def checkpoint_bytes(facts: GgufFacts, kv_type: str) -> int:
    """One slot's context checkpoint: what of its cache cannot be rolled back, the sliding-window layers'
    cells (the window and a ubatch) and the recurrent layers' state (one row); 0 for a model with neither."""
    total = 0
    for layer in range(facts.num_layers):
        if facts.is_recurrent(layer):
            total += recurrent_state_bytes(facts, "python")  # "python": the states of one sequence
        elif is_sliding(facts, layer):
            assert facts.sliding_window
            total += int(min(facts.sliding_window + UBATCH, facts.max_position or 1 << 30)
                         * kv_bytes_per_token_layer(facts, kv_type, layer))  # fmt: skip
    return total
