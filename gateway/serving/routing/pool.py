"""The replicas that serve one model, and which of them a request goes to.

A turn goes to the replica that served its conversation's last turn: that replica's KV cache holds the
conversation, and anywhere else the whole prompt (20k tokens and more for a coding agent) is prefilled
again. A new conversation goes where its parent's is (an agent's subagents and threads share its system
prompt and tools: :mod:`gateway.serving.routing.affinity`), else where the least prefill would be ahead
of its first token: the prefill under way on the replica (what the requests placed there and not over yet
must prefill, by each replica's own :class:`KnownPrefixes`, the estimate the scheduler orders by) plus
its own there — only its new part where the replica holds or is prefilling at least 30 % of its prompt
(the routers' ``--cache-threshold``), else all of it. So sessions that start together are spread by their
size, not only their count (a 20k-token Claude Code turn outweighs an 800-token aider one), and sessions
of one agent gather where its system prompt and tools are being prefilled, while that is the least work
ahead of them: the replica's admission holds each until that prefill is over (the engines share no
prefill under way; :meth:`KnownPrefixes.new_tokens` ``held_only``), so the start is prefilled once, not
once per replica (16 sessions on two replicas: 150,200 tokens prefilled where one engine prefilled
90,904, until they were gathered). Ties go to the lighter replica by requests, then to one that holds
more of the prompt, then to the one with the fewest conversations bound. A conversation leaves its
replica only when that replica is down, restarted (its cache is gone) or just failed a request, or when
the load is unbalanced past both of the thresholds that the cache-aware routers in front of vLLM and
SGLang use (``--balance-abs-threshold 64 --balance-rel-threshold 1.5``: the replica's load exceeds the
least loaded one's by more than 64 requests *and* by more than 1.5 times). A move is counted: the
conversation's next turn prefills again.

Load is what the pool itself counts: the requests placed on a replica and not over yet, queued for one
of its slots or in the engine (:class:`Placement` is each request's lease on it). With one replica the
pool is not consulted at all (:meth:`Pool.route` returns at once): a gateway of one engine behaves
exactly as it did.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from gateway.serving.routing.affinity import Affinity, affinity_of
from gateway.serving.routing.bindings import Bindings
from gateway.serving.routing.ttft import TtftRecord, p95_of
from gateway.serving.scheduling.sessions import CHARS_PER_TOKEN, KnownPrefixes, PromptUnits
from gateway.serving.wire.error_shapes import ApiError, unavailable

U = TypeVar("U")

BALANCE_ABS = 64  # the routers' --balance-abs-threshold
BALANCE_REL = 1.5  # the routers' --balance-rel-threshold
PREFIX_SHARE = 0.3  # the routers' --cache-threshold: the share of a prompt a replica must hold to be preferred
SUSPECT_S = 10.0  # after a request failed on it, a replica takes no new placement for this long (a connect timeout)


class Health(enum.Enum):
    UP = "up"
    STARTING = "starting"  # starting or restarting: not serving yet
    DOWN = "down"


class Why(enum.Enum):
    """Why a request went to its replica (each counted per replica)."""

    ONLY = "only"  # one replica: nothing was chosen
    WARM = "warm"  # the replica that served the conversation's last turn
    PARENT = "parent"  # a new conversation, where its parent's is
    PREFIX = "prefix"  # a new conversation, where its prompt's start was sent before
    LEAST_LOADED = "least_loaded"  # a new conversation, nowhere better
    MOVED_LOAD = "moved_load"  # its replica was loaded past the thresholds: the next turn prefills again
    MOVED_DOWN = "moved_down"  # its replica is down, restarted or failing: the next turn prefills again
    RETRY = "retry"  # its replica failed before a byte was sent to the client: tried here instead


@dataclass(frozen=True)
class Balance:
    """When load outweighs the cache: both thresholds must be passed (settings balance_*_threshold)."""

    abs_threshold: int = BALANCE_ABS
    rel_threshold: float = BALANCE_REL

    def unbalanced(self, load: int, least: int) -> bool:
        return load - least > self.abs_threshold and load > self.rel_threshold * least


@dataclass
class ReplicaCounters:
    """Per replica, since the gateway started: how requests came to it and what they waited."""

    requests: int = 0
    warm: int = 0
    parent: int = 0
    prefix: int = 0
    least_loaded: int = 0
    moved_load: int = 0
    moved_down: int = 0
    retry: int = 0
    failed: int = 0  # requests that failed here before their first byte (each tried elsewhere, or answered 503)
    ttft_s: float = 0.0
    ttft_count: int = 0

    def count(self, why: Why) -> None:
        self.requests += 1
        if why is not Why.ONLY:
            setattr(self, why.value, getattr(self, why.value) + 1)

    def row(self) -> dict[str, Any]:
        later = self.warm + self.moved_load + self.moved_down
        return {
            **{name: value for name, value in asdict(self).items() if name not in ("ttft_s", "ttft_count")},
            # of the turns that continued a conversation known here, the share sent where its cache was
            "warm_share": round(self.warm / later, 3) if later else None,
            "ttft_s_mean": round(self.ttft_s / self.ttft_count, 3) if self.ttft_count else None,
        }


class Replica(Generic[U]):
    """One engine serving the model: ``upstream`` is what a request is sent through (the runtime decides
    what that is). Its state is its supervisor's word (``health``, read at each placement) or, without
    one, what :meth:`mark` last said; its ``generation`` changes when it comes back (an empty cache)."""

    def __init__(
        self,
        name: str,
        upstream: U,
        *,
        node: str = "",
        devices: Sequence[str] = (),
        health: Callable[[], Health] | None = None,
        generation: Callable[[], int] | None = None,
        prefixes: KnownPrefixes | None = None,
    ) -> None:
        self.name = name
        self.upstream = upstream
        self.node = node
        self.devices = tuple(devices)
        self._health = health
        self._generation = generation
        self._marked = Health.UP
        self._marked_generation = 0
        self.prefixes = prefixes if prefixes is not None else KnownPrefixes()
        self.prefixes_generation = self.generation  # the generation whose prompts ``prefixes`` remembers
        self.queued = 0  # placed here, waiting for one of its slots
        self.active = 0  # in its engine
        self.pending_tokens = 0  # what the requests placed here and not over yet must prefill (their estimates)
        self.suspect_until = float("-inf")
        self.counters = ReplicaCounters()
        self.ttft = TtftRecord()  # its first outputs: a histogram for /metrics, the latest for the p95

    @property
    def state(self) -> Health:
        return self._health() if self._health is not None else self._marked

    @property
    def generation(self) -> int:
        return self._generation() if self._generation is not None else self._marked_generation

    @property
    def load(self) -> int:
        return self.queued + self.active

    def mark(self, state: Health) -> None:
        """Set the state of a replica that has no ``health`` probe; coming back up starts a new generation."""
        if state is Health.UP and self._marked is not Health.UP:
            self._marked_generation += 1
        self._marked = state

    def __repr__(self) -> str:
        return f"Replica({self.name!r}, {self.state.value}, load={self.load})"


class Phase(enum.Enum):
    """Where a placed request is in its replica's load."""

    QUEUED = "queued"  # waiting for one of the replica's slots
    ACTIVE = "active"  # in one of them
    RELEASED = "released"  # over, or never counted


class Placement(Generic[U]):
    """One request's place on a replica: counted in the replica's load from placement until
    :meth:`release` (idempotent), as queued until :meth:`admitted`. A placement on the only replica
    counts nothing."""

    def __init__(
        self,
        replica: Replica[U],
        why: Why,
        *,
        affinity: Affinity | None = None,
        units: PromptUnits | None = None,
        new_tokens: int | None = None,
        tried: frozenset[str] = frozenset(),
        counted: bool = True,
    ) -> None:
        self.replica = replica
        self.why = why
        self.affinity = affinity
        self.units = units
        self.new_tokens = new_tokens  # what the replica must prefill, by its own prefix estimate (None: not asked)
        self.tried = tried | {replica.name}  # replicas this request has been placed on
        self._counted = counted
        self._phase = Phase.QUEUED if counted else Phase.RELEASED
        self._pending = (new_tokens or 0) if counted else 0
        if counted:
            replica.queued += 1
            replica.pending_tokens += self._pending

    @property
    def released(self) -> bool:
        return self._phase is Phase.RELEASED

    def admitted(self) -> None:
        """The request got one of the replica's slots: from queued to active."""
        if self._phase is Phase.QUEUED:
            self._phase = Phase.ACTIVE
            self.replica.queued -= 1
            self.replica.active += 1

    def first_output(self, ttft_s: float) -> None:
        if self._counted:
            self.replica.counters.ttft_s += ttft_s
            self.replica.counters.ttft_count += 1
            self.replica.ttft.observe(ttft_s)

    def release(self) -> None:
        """The request is over (answered, failed, or its client left): the replica's load drops."""
        if self._phase is Phase.QUEUED:
            self.replica.queued -= 1
        elif self._phase is Phase.ACTIVE:
            self.replica.active -= 1
        if self._phase is not Phase.RELEASED:
            self.replica.pending_tokens -= self._pending
        self._phase = Phase.RELEASED


class Pool(Generic[U]):
    def __init__(
        self,
        replicas: Iterable[Replica[U]],
        *,
        balance: Balance | None = None,
        bindings: Bindings | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefix_share: float = PREFIX_SHARE,
        suspect_s: float = SUSPECT_S,
    ) -> None:
        self.balance = balance or Balance()
        self.clock = clock
        self.bindings = bindings if bindings is not None else Bindings(clock=clock)
        self.prefix_share = prefix_share
        self.suspect_s = suspect_s
        self._set(list(replicas))

    def _set(self, replicas: list[Replica[U]]) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        names = [replica.name for replica in replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names repeat: {names}")
        self.replicas: tuple[Replica[U], ...] = tuple(replicas)
        self._by_name = {replica.name: replica for replica in replicas}
        # the one placement on the only replica: it counts nothing, so every request can share it
        self._only = Placement(replicas[0], Why.ONLY, counted=False) if len(replicas) == 1 else None

    def add(self, replica: Replica[U]) -> None:
        """A replica joins (a node came back, a plan made again): it takes new conversations."""
        self._set([*self.replicas, replica])

    def remove(self, name: str) -> None:
        """A replica leaves for good: its conversations move at their next turn (counted)."""
        self._set([replica for replica in self.replicas if replica.name != name])

    @property
    def single(self) -> Replica[U] | None:
        """The only replica, when there is one: nothing to route."""
        return self.replicas[0] if len(self.replicas) == 1 else None

    def __getitem__(self, name: str) -> Replica[U]:
        return self._by_name[name]

    def route(self, headers: Mapping[str, str], session: str, units: PromptUnits | None = None) -> Placement[U]:
        """The replica for a request (``session``: the scheduler's session id for it). With one replica
        it returns at once: no headers read, nothing bound, nothing counted."""
        if self._only is not None:
            return self._only
        return self.place(affinity_of(headers, session), units)

    def place(
        self, affinity: Affinity, units: PromptUnits | None = None, *, avoid: frozenset[str] = frozenset()
    ) -> Placement[U]:
        """Choose the replica for a conversation (none of ``avoid``), bind the conversation to it, and, given
        the prompt's units, estimate what it must prefill there and remember the prompt as sent there."""
        serving = self._serving(avoid)
        least = min(serving, key=self._lightness)
        chosen, moved = self._sticky(affinity, serving, least)
        if chosen is None:
            chosen, why = self._new(affinity, units, serving, least)
            why = moved or why
        else:
            why = moved or Why.WARM
        if avoid:
            why = Why.RETRY
        self._bind(affinity, chosen)
        chosen.counters.count(why)
        new_tokens = None
        if units is not None:
            new_tokens = chosen.prefixes.new_tokens(units)
            chosen.prefixes.remember(units)
        return Placement(chosen, why, affinity=affinity, units=units, new_tokens=new_tokens, tried=avoid)

    def failed(self, placement: Placement[U]) -> None:
        """A request failed on its replica before its first byte: the replica takes no new placement for
        ``suspect_s`` (its supervisor's word, which takes longer, then decides)."""
        replica = placement.replica
        replica.counters.failed += 1
        replica.suspect_until = self.clock() + self.suspect_s

    def reroute(self, placement: Placement[U]) -> Placement[U] | None:
        """The same request on a replica it has not been tried on (released from the one that failed), or
        None when no other replica serves."""
        placement.release()
        if placement.affinity is None:  # placed on the only replica: there is no other
            return None
        try:
            return self.place(placement.affinity, placement.units, avoid=placement.tried)
        except ApiError:  # no other replica serves: the caller answers with the first failure
            return None

    # -- choosing ----------------------------------------------------------------------------------
    def _serving(self, avoid: frozenset[str]) -> list[Replica[U]]:
        """The replicas a request may go to: up and not just failed; failing that, up ones that just
        failed (better another try than a certain 503)."""
        now = self.clock()
        up = [replica for replica in self.replicas if replica.name not in avoid and replica.state is Health.UP]
        for replica in up:
            if replica.prefixes_generation != replica.generation:  # it came back with an empty cache
                replica.prefixes = KnownPrefixes(replica.prefixes.limit)
                replica.prefixes_generation = replica.generation
                replica.suspect_until = float("-inf")  # a failure before it came back is its last life's
        serving = [replica for replica in up if replica.suspect_until <= now] or up
        if not serving:
            states = ", ".join(f"{replica.name} {replica.state.value}" for replica in self.replicas)
            raise unavailable(f"no replica of the model is serving ({states}); retry shortly")
        return serving

    def _lightness(self, replica: Replica[U]) -> tuple[int, int, int]:
        bound = self.bindings.conversations.get(replica.name, 0)
        return replica.load, bound, self.replicas.index(replica)

    def _bound(self, name: str, serving: list[Replica[U]]) -> Replica[U] | None:
        """The replica ``name`` was served on, if it serves now with the same cache."""
        binding = self.bindings.get(name)
        if binding is None:
            return None
        replica = self._by_name.get(binding.replica)
        if replica is None or replica not in serving or binding.generation != replica.generation:
            return None
        return replica

    def _sticky(
        self, affinity: Affinity, serving: list[Replica[U]], least: Replica[U]
    ) -> tuple[Replica[U] | None, Why | None]:
        """A known conversation: its replica (WARM), else the least loaded one past the thresholds, else
        (its replica is gone) no choice yet, counted as a move."""
        if self.bindings.get(affinity.own) is None:
            return None, None
        replica = self._bound(affinity.own, serving)
        if replica is None:
            return None, Why.MOVED_DOWN
        if replica is not least and self.balance.unbalanced(replica.load, least.load):
            return least, Why.MOVED_LOAD
        return replica, Why.WARM

    def _new(
        self, affinity: Affinity, units: PromptUnits | None, serving: list[Replica[U]], least: Replica[U]
    ) -> tuple[Replica[U], Why]:
        """Where a conversation with no replica goes: its nearest parent's, unless that replica is loaded past
        the thresholds; else where the prefill under way plus its own (its new part where the replica holds
        its start, else all of it) is least, then the lighter by requests, then one that holds its start."""
        for parent in affinity.parents:
            replica = self._bound(parent, serving)
            if replica is not None:
                if self.balance.unbalanced(replica.load, least.load):
                    return least, Why.LEAST_LOADED
                return replica, Why.PARENT
        if units is None or not units.total_chars:
            return least, Why.LEAST_LOADED
        whole = units.tokens
        new = {replica.name: replica.prefixes.new_tokens(units) for replica in serving}
        shares = {name: self._held_share(tokens, units) for name, tokens in new.items()}
        held = {name: share if share >= self.prefix_share else 0.0 for name, share in shares.items()}

        def rank(replica: Replica[U]) -> tuple[int, int, float, int, int]:
            load, bound, position = self._lightness(replica)
            cost = new[replica.name] if held[replica.name] else whole  # a start held below the share: no pull
            return replica.pending_tokens + cost, load, -held[replica.name], bound, position

        best = min(serving, key=rank)
        return best, Why.PREFIX if held[best.name] else Why.LEAST_LOADED

    @staticmethod
    def _held_share(new_tokens: int, units: PromptUnits) -> float:
        """The share of the prompt a replica likely holds (what it need not prefill: all but ``new_tokens``)."""
        new_chars = min(new_tokens * CHARS_PER_TOKEN, units.total_chars)
        return 1.0 - new_chars / units.total_chars

    def _bind(self, affinity: Affinity, chosen: Replica[U]) -> None:
        """The conversation is on ``chosen`` now; so is each parent that has no replica yet (a Codex session's
        first thread names it), and a parent already there stays bound longer."""
        self.bindings.bind(affinity.own, chosen.name, chosen.generation, conversation=True)
        for parent in affinity.parents:
            binding = self.bindings.get(parent)
            if binding is None or binding.replica == chosen.name:
                self.bindings.bind(parent, chosen.name, chosen.generation, conversation=False)

    # -- showing -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """For /status: per replica, its state, load, conversations bound, counters and TTFT (mean since
        start, p95 of the latest first outputs); the pool's totals."""
        self.bindings.expire()
        rows = []
        totals = ReplicaCounters()
        for replica in self.replicas:
            counters = replica.counters
            for name, value in asdict(counters).items():
                setattr(totals, name, getattr(totals, name) + value)
            rows.append(
                {
                    "name": replica.name,
                    "node": replica.node,
                    "devices": list(replica.devices),
                    "state": replica.state.value,
                    "generation": replica.generation,
                    "sessions_bound": self.bindings.conversations.get(replica.name, 0),
                    "active": replica.active,
                    "queued": replica.queued,
                    **counters.row(),
                    "ttft_s_p95": replica.ttft.p95(),
                }
            )
        return {
            "replicas": rows,
            "totals": {
                "active": sum(replica.active for replica in self.replicas),
                "queued": sum(replica.queued for replica in self.replicas),
                "bindings": len(self.bindings),
                **totals.row(),
                "ttft_s_p95": p95_of(sample for replica in self.replicas for sample in replica.ttft.recent),
            },
            "balance": {"abs_threshold": self.balance.abs_threshold, "rel_threshold": self.balance.rel_threshold},
        }
