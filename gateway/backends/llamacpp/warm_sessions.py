"""What llama-server keeps of past prompts so that an agent's next turn prefills only what is new,
sized by the plan and counted in its memory.

A coding agent resends its whole conversation every turn (20-100k tokens). llama-server reuses what
a slot's cache still holds of it; what the plan sets on purpose here decides how long that lasts
when several sessions, side requests and subagents share the four slots:

- Room in the unified context (``-c`` above the context, ``--kv-unified-per-slot`` the context):
  with ``--kv-unified`` the four slots share one cache of ``-c`` cells. At ``-c`` = the context, two
  sessions of 20k and 18k tokens do not fit in 32k together, and b11434 restores a session from the
  RAM cache below *before* it clears the idle slots that fill the cache: the restore finds no free
  cells ("failed to restore kv cache"), and the whole prompt is prefilled again (measured: Claude Code
  interleaved with two agents met the goal on 1 of 6 turns). So the plan gives the cache room for up
  to three more contexts, from what the placement's devices and RAM leave once the context itself is
  chosen (never at its expense), with the same layers where they were; ``--kv-unified-per-slot`` keeps
  one request to the context the gateway advertises (b11434 caps each slot's context at it, and a
  longer prompt gets the engine's own "exceeds the available context size" error, so the gateway adds
  no check of its own). The room's KV is in the placement's terms like the rest of the cache. A
  LongRoPE model (Phi-3/3.5/4-mini: GGUF tensor ``rope_factors_long``) gets room only up to its
  original training context: b11434 picks its RoPE factors from the whole ``-c`` under ``--kv-unified``,
  not from the per-slot cap (:func:`long_rope_room`).
- ``--cache-ram``: a slot's prompt is saved to a host-RAM cache before another request takes the
  slot, and restored from there when its session comes back (b11434's default is 8 GiB whatever the
  machine has, uncounted). The plan gives it half the RAM its own terms and margin leave, at most
  what four full-context prompts hold (one per slot) or, when more sessions are asked for
  (``--sessions``), what that many agent prompts of 32k tokens hold, and none below 256 MiB unless
  that is all they need (a small model's). With ``--kv-unified`` and
  ``--cache-idle-slots`` (b11434's default) every idle slot is saved here and cleared when a request
  starts, so a session other agents' turns came between comes back from this cache, into the room above.
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

from dataclasses import dataclass, replace

from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.kv_cache import KV_PAD, is_sliding, kv_bytes_per_token_layer, recurrent_state_bytes
from gateway.backends.llamacpp.launcher import NATIVE_PARALLEL, UBATCH
from gateway.backends.llamacpp.placement import HOST_MARGIN_BYTES, Placement, place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.core.devices import GIB, MIB
from gateway.core.policy import AGENT_PROMPT_TOKENS

SLOTS = NATIVE_PARALLEL  # llama-server's -np
MIN_CACHE_BYTES = 256 * MIB
MAX_CHECKPOINTS = 8  # per slot (b11434's default is 32): the last few turns' checkpoints
CACHE_REUSE_TOKENS = 256
SLOT_SIMILARITY = 0.10
ROOM_STEPS = 8  # the room is sized in eighths of a context


@dataclass(frozen=True)
class WarmSessions:
    """The room in the unified context, the prompt cache in RAM and the context checkpoints per slot,
    with what they cost."""

    cache_ram_bytes: int = 0
    checkpoints: int = 0  # per slot; 0 where the model has no layer that needs them
    checkpoint_bytes: int = 0  # one checkpoint of one slot
    room_cells: int = 0  # the unified cache's cells beyond one request's context (-c is the two together)
    room_bytes: int = 0  # the KV those cells take, on the devices that hold it (already in the placement's terms)
    long_rope: int = 0  # the LongRoPE original context that bounded the room (0: none did)

    @property
    def host_bytes(self) -> int:
        """The prompt cache and the checkpoints (the room's KV is in the placement's own terms)."""
        return self.cache_ram_bytes + SLOTS * self.checkpoints * self.checkpoint_bytes

    def argv(self) -> list[str]:
        argv = ["--cache-ram", str(self.cache_ram_bytes // MIB), "--cache-reuse", str(CACHE_REUSE_TOKENS)]
        argv += ["--slot-prompt-similarity", f"{SLOT_SIMILARITY:g}"]
        return [*argv, "--ctx-checkpoints", str(self.checkpoints)]

    def phrase(self, n_ctx: int) -> str:
        """The plan's reason: "; unified KV 131,072 cells: 98,304 beyond the context (3.0x) for sessions
        kept warm, +12.00 GiB KV; prompt cache 4.0 GiB in RAM, 8 checkpoints/slot (1.2 GiB)"."""
        room = "; unified KV of the context alone: no room for sessions kept warm"
        if self.room_cells:
            room = (
                f"; unified KV {n_ctx + self.room_cells:,} cells: {self.room_cells:,} beyond the context "
                f"({self.room_cells / n_ctx:.1f}x) for sessions kept warm, +{self.room_bytes / GIB:.2f} GiB KV"
            )
        if self.long_rope:
            room += f" (LongRoPE: none past its original {self.long_rope:,}, where llama.cpp takes the long factors)"
        cache = (
            f"prompt cache {self.cache_ram_bytes / GIB:.1f} GiB in RAM" if self.cache_ram_bytes else "no prompt cache"
        )
        held = SLOTS * self.checkpoints * self.checkpoint_bytes
        return f"{room}; {cache}" + (f", {self.checkpoints} checkpoints/slot ({held / GIB:.1f} GiB)" if held else "")


def size(
    spare_bytes: int, kv_bytes: int, checkpoint_bytes: int, room: tuple[int, int] = (0, 0), wanted: int = 0
) -> WarmSessions:
    """Fit the caches into ``spare_bytes`` of RAM (what the plan's own terms, the room included, and
    margin leave): checkpoints first (without them a sliding-window or recurrent model re-prefills
    everything), then half of the rest for the prompt cache, at most four times ``kv_bytes`` (one
    context's KV). ``room``: the room in the unified context, (cells, KV bytes), as :func:`widen` found it."""
    spare = max(spare_bytes, 0)
    checkpoints = 0
    if checkpoint_bytes:
        checkpoints = min(MAX_CHECKPOINTS, spare // 2 // (SLOTS * checkpoint_bytes))
        spare -= checkpoints * SLOTS * checkpoint_bytes
    wanted = max(wanted, SLOTS * kv_bytes)
    cache = min(spare // 2, wanted)
    cache = cache // MIB * MIB if cache >= min(MIN_CACHE_BYTES, wanted) and cache >= MIB else 0
    return WarmSessions(cache, checkpoints, checkpoint_bytes if checkpoints else 0, *room)


def widen(query: PlacementQuery, base: Placement, host_spare: int) -> tuple[int, Placement]:
    """Room in the unified cache beyond one request's context (``query.n_ctx``): the most cells (up to
    ``SLOTS - 1`` more contexts, in steps of an eighth of one, whole 256-cell pages) that the GPUs hold
    with ``base``'s layers, experts and split, costing at most ``host_spare`` more bytes of RAM; with the
    placement at that size (its KV and masks larger). (0, ``base``) when there is no room: the context
    was chosen first and keeps its place. Bisection: at most 6 placements per rung (the plan's search stays quick)."""
    facts, n_ctx = query.facts, query.n_ctx

    def placed(extra: int) -> Placement:
        split = base.tensor_split or None
        return place(query.with_context(n_ctx + extra), base.n_gpu_layers, base.n_cpu_moe, split)

    def holds(placement: Placement) -> bool:
        return not placement.overflow() and placement.host_total - base.host_total <= host_spare

    most = min((SLOTS - 1) * n_ctx, long_rope_room(facts, n_ctx))
    if most <= 0:
        return 0, base
    if holds(widest := placed(most)):
        return most, widest
    step = max(KV_PAD, n_ctx // ROOM_STEPS // KV_PAD * KV_PAD)
    low, high, found = 0, (most - 1) // step, base  # in steps: low holds, high + 1 does not
    while low < high:
        middle = (low + high + 1) // 2
        if holds(candidate := placed(middle * step)):
            low, found = middle, candidate
        else:
            high = middle - 1
    return low * step, found


def long_rope_room(facts: GgufFacts, n_ctx: int) -> int:
    """The most room that leaves a LongRoPE model on the RoPE factors its context implies. With
    ``--kv-unified`` llama.cpp's per-sequence context is the whole ``-c`` (src/llama-context.cpp:294-295:
    ``n_ctx_seq = n_ctx``, padded to 256 at :292; ``--kv-unified-per-slot`` caps only the server's slots,
    tools/server/server-context.cpp:4376-4385), and ``get_rope_factors`` (src/llama-model.cpp:2351) takes the
    long factors for every token once ``n_ctx_seq > n_ctx_orig_yarn``: room past that would change every
    answer of a model served at a context within it. Unbounded for any other model, or one whose context
    alone is past it (long factors either way)."""
    original = facts.long_rope_context
    if not original or -(-n_ctx // KV_PAD) * KV_PAD > original:
        return (SLOTS - 1) * n_ctx
    return original // KV_PAD * KV_PAD - n_ctx


def keep_warm(
    query: PlacementQuery, placement: Placement, ram_available: int, *, fits: bool, sessions: int = SLOTS
) -> tuple[WarmSessions, Placement]:
    """What keeps sessions warm for a placement of ``query`` (llama-server's) that the plan chose: where
    it ``fits``, room in the unified cache from what the devices and half the spare RAM leave
    (:func:`widen`); then the checkpoints and the prompt cache from the RAM left after that
    (:func:`size`). With the placement the engine will then take (its KV with the room)."""
    facts, n_ctx, kv_type = query.facts, query.n_ctx, query.kv_type
    context_kv = kv_total(placement)
    room, roomy = 0, placement
    if fits:
        spare = (ram_available - placement.host_total - HOST_MARGIN_BYTES) // 2
        room, roomy = widen(query, placement, spare)
    spare = ram_available - roomy.host_total - HOST_MARGIN_BYTES
    # the prompt cache is wanted for four contexts (one per slot), or for the sessions asked for (--sessions) at
    # an agent's typical prompt, whichever is more
    sessions_kv = sessions * context_kv * min(n_ctx, AGENT_PROMPT_TOKENS) // max(n_ctx, 1)
    checkpoint = checkpoint_bytes(facts, kv_type)
    warm = size(spare, context_kv, checkpoint, (room, kv_total(roomy) - context_kv), wanted=sessions_kv)
    if fits and long_rope_room(facts, n_ctx) < (SLOTS - 1) * n_ctx:
        warm = replace(warm, long_rope=facts.long_rope_context)
    return warm, roomy


def kv_total(placement: Placement) -> int:
    """The placement's whole KV cache, on the devices and in RAM."""
    return sum(placement.device_kv) + placement.host_kv


def checkpoint_bytes(facts: GgufFacts, kv_type: str) -> int:
    """One slot's context checkpoint: what of its cache cannot be rolled back, the sliding-window layers'
    cells (the window and a ubatch) and the recurrent layers' state (one row); 0 for a model with neither."""
    total = 0
    for layer in range(facts.num_layers):
        if facts.is_recurrent(layer):
            total += recurrent_state_bytes(facts, 1)  # the states of one sequence
        elif is_sliding(facts, layer):
            assert facts.sliding_window
            total += int(min(facts.sliding_window + UBATCH, facts.max_position or 1 << 30)
                         * kv_bytes_per_token_layer(facts, kv_type, layer))  # fmt: skip
    return total
