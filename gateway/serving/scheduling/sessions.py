"""Who a request belongs to, and how much of its prompt the engine likely holds already.

Many agents share one engine: Claude Code's subagents, a developer's two or three agents, a team. To
schedule them (:mod:`gateway.serving.scheduling.admission`) and to show who uses the node
(:mod:`gateway.serving.scheduling.usage_board`), each request gets:

- a **session**: what the agent says names its conversation (Claude Code's ``x-claude-code-session-id``,
  Codex's ``session-id`` header or ``prompt_cache_key``, opencode's ``x-session-affinity``), else a hash
  of the conversation's stable start (tools, system prompt, first user message): Qwen Code, Cline and
  aider send no id, and their conversation's start stays byte-identical from turn to turn;
- a **key id**: a short hash of the configured API key it authenticated with (never the key, never
  another header's value), so that keys share the engine fairly and are counted apart;
- a **prefill estimate**: the prompt is cut into units (tools, system, each message) and fingerprinted
  unit by unit; the longest run of leading units the gateway has already sent to the engine is what
  the engine's prefix cache likely holds, so the rest is what it must prefill. A session's next turn
  (its previous prompt plus a tool result) is short; a new conversation with its own 20k tokens is
  long; a subagent that shares its parent's tools and system prompt is short too. This is the gateway's
  belief, not the engine's word: the engine's own count comes back in the usage figures.

The memory of prefixes is shared and bounded, so one request may add only a few of its units to it
(:func:`kept_units`: the tools and system, the first user message, the last ones, and a few spread
back from the end): one request of 70,000 messages once put 70,001 fingerprints into the 65,536 kept
and pushed out every session's, whose next warm turns were then taken for cold ones (pinned, in the
long lane). A fingerprint names everything up to its unit, so a prefix is known wherever it ends.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# headers agents send that name their conversation, most specific first (tests/data/agent-requests)
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-affinity", "x-session-id")
CHARS_PER_TOKEN = 4  # a rough, engine-free estimate: only the order of magnitude matters here
LONG_PREFILL_TOKENS = 2048  # an estimated prefill above this is a long one (a cold prompt, a large file)
KNOWN_PREFIXES = 65_536  # fingerprints remembered (LRU); ~100 bytes each
OFF_LOOP_BYTES = 64 * 1024  # a body this large is fingerprinted in a worker thread (see prompt_units_beside)
LAST_UNITS_KEPT = 16  # a request's last units, each remembered (an agent edits or re-marks its last messages)


@dataclass(frozen=True)
class Identity:
    """A request's session and key ids, as the access log, metrics and the scheduler name them."""

    session: str  # 12 hex digits
    session_from: str  # the header or field that named it, or "prefix" (the conversation's stable start)
    key: str  # "key-" + 8 hex digits of the key's hash; "open" when the gateway has no keys


def key_id(key: str | None) -> str:
    """A stable, non-reversible short name for an API key (keys are never logged)."""
    if not key:
        return "open"
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def _short(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def identify(headers: Mapping[str, str], payload: Mapping[str, Any], units: PromptUnits, key: str | None) -> Identity:
    """The request's session: the agent's own id where it sends one, else its conversation's stable start."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return Identity(_short(value.strip()[:256]), name, key_id(key))
    cache_key = payload.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key.strip():
        return Identity(_short(cache_key.strip()[:256]), "prompt_cache_key", key_id(key))
    return Identity(units.stable_start[:12], "prefix", key_id(key))


@dataclass(frozen=True)
class PromptUnits:
    """A prompt cut where conversations diverge: tools, system text, then one unit per message (or item),
    each with the fingerprint of everything up to it and the characters so far."""

    chained: tuple[str, ...]  # fingerprint of units [0..i]
    chars: tuple[int, ...]  # characters of units [0..i]
    stable_start: str  # fingerprint up to the first user message (the conversation's name when none is sent)
    stable_index: int = 0  # the unit that ends the stable start

    @property
    def total_chars(self) -> int:
        return self.chars[-1] if self.chars else 0

    @property
    def tokens(self) -> int:
        """The whole prompt's estimated tokens (what :meth:`KnownPrefixes.new_tokens` counts a part of)."""
        return self.total_chars // CHARS_PER_TOKEN


# one encoder for every unit: json.dumps with options builds a new one per call (a third of the cost)
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _encode(unit: Any) -> bytes:
    return _ENCODER.encode(unit).encode("utf-8", "surrogatepass")


def _is_user(unit: Any) -> bool:
    return isinstance(unit, dict) and unit.get("role") == "user"


def prompt_units(payload: Mapping[str, Any]) -> PromptUnits:
    """Cut a chat, Messages, Responses or text-completion request into its units (the parts an agent's
    next turn repeats byte for byte) and fingerprint them in a chain."""
    head: list[Any] = [payload.get("tools"), payload.get("system"), payload.get("instructions")]
    body: Iterable[Any]
    if isinstance(payload.get("messages"), list):
        body = payload["messages"]
    elif isinstance(payload.get("input"), list):
        body = payload["input"]
    elif "input" in payload:
        body = [payload.get("input")]
    else:
        body = [payload.get("prompt")]
    digest = hashlib.blake2b(digest_size=12)
    chained: list[str] = []
    chars: list[int] = []
    total = 0
    stable = -1
    for index, unit in enumerate([head, *body]):
        encoded = _encode(unit)
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
        total += len(encoded)
        chained.append(digest.copy().hexdigest())
        chars.append(total)
        if stable < 0 and index and _is_user(unit):
            stable = index
    stable = stable if stable >= 0 else len(chained) - 1
    return PromptUnits(tuple(chained), tuple(chars), chained[stable], stable)


# one thread: the work holds the GIL between its encodings, so more threads would not go faster, only
# take more turns from the event loop (several large requests at once queue here, one after the other)
_BESIDE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fingerprints")


async def estimate_beside(known: KnownPrefixes, payload: Mapping[str, Any], body_bytes: int) -> tuple[PromptUnits, int]:
    """:func:`prompt_units` of a request whose body is ``body_bytes`` long, and the tokens ``known``
    says the engine must prefill of it; a large one in a worker thread, beside the event loop: its many
    small encodings let the loop serve between them (one request of 99,000 messages held the loop
    0.5 s, and every other client, ``/health`` included, waited). A single huge message is one encoding
    that holds the GIL (0.2 s for 30 MB: the body cap's size)."""

    def estimate() -> tuple[PromptUnits, int]:
        units = prompt_units(payload)
        return units, known.new_tokens(units)  # lookups only: the loop alone changes ``known``

    if body_bytes < OFF_LOOP_BYTES:
        return estimate()
    return await asyncio.get_running_loop().run_in_executor(_BESIDE, estimate)


def kept_units(units: PromptUnits) -> list[int]:
    """The units of a request the memory of prefixes keeps (30 of the 100,000 a body may hold): the
    tools and system (a subagent shares its parent's), the first user message, the last
    ``LAST_UNITS_KEPT`` (the next turn extends the prompt, or edits its end), and one at every doubling
    of the distance from the end (a conversation that diverges mid-way is still found warm up to a
    point at most twice as far back)."""
    count = len(units.chained)
    kept = {0, units.stable_index, *range(max(count - LAST_UNITS_KEPT, 0), count)}
    back = LAST_UNITS_KEPT * 2
    while back < count:
        kept.add(count - back)
        back *= 2
    return sorted(kept)


class KnownPrefixes:
    """The prompt prefixes the gateway has sent to the engine lately (fingerprint → characters, and whether
    the engine has prefilled them), to estimate what the engine's prefix cache holds of a new request.
    Bounded; least recently seen go first.

    A prompt counts as sent from the moment it is placed, and as held once its prefill is over (the
    engine's first output, or its answer: :meth:`prefilled`). Between the two the engine cannot share it:
    neither llama-server's slots nor vLLM's blocks give a second request a prefill still under way, so
    eight sessions of one agent sent together each prefilled the whole 20k-token start."""

    def __init__(self, limit: int = KNOWN_PREFIXES) -> None:
        self.limit = limit
        self._seen: collections.OrderedDict[str, tuple[int, bool]] = collections.OrderedDict()

    def new_tokens(self, units: PromptUnits, *, held_only: bool = False) -> int:
        """The estimated tokens the engine must prefill: everything past the longest known prefix (the
        last unit whose fingerprint is known: it names all the units before it too). ``held_only``: known
        as prefilled, what the engine would prefill were the request sent now; else as sent too, what it
        prefills once the prompts sent before it are through."""
        held = 0
        for index in range(len(units.chained) - 1, -1, -1):
            known = self._seen.get(units.chained[index])
            if known is not None and (known[1] or not held_only):
                held = units.chars[index]
                break
        return max(units.total_chars - held, 0) // CHARS_PER_TOKEN

    def remember(self, units: PromptUnits) -> None:
        """Note the prompt as sent: a few of its units (:func:`kept_units`), so that one request cannot
        push out the prefixes of every other."""
        for index in kept_units(units):
            fingerprint = units.chained[index]
            known = self._seen.get(fingerprint)
            self._seen[fingerprint] = (units.chars[index], known is not None and known[1])
            self._seen.move_to_end(fingerprint)
        self._trim()

    def prefilled(self, units: PromptUnits) -> None:
        """The engine has prefilled the prompt: its units count as held."""
        for index in kept_units(units):
            fingerprint = units.chained[index]
            self._seen[fingerprint] = (units.chars[index], True)
            self._seen.move_to_end(fingerprint)
        self._trim()

    def _trim(self) -> None:
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)
