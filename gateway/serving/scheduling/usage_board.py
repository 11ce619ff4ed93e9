"""Who uses the node: per API key and per agent session, what they asked of the engine and what they waited.

Each request's figures (its session and key ids, time queued, time to first token, prompt tokens the
engine evaluated or reused from its cache, output tokens) are added up per key and per session. A key
id names a configured key (or ``open``), so keys are few, yet both tables are bounded alike: the board
keeps the most recently seen ``KEYS_KEPT`` keys and ``SESSIONS_KEPT`` sessions (older ones summed into a
folded row) and shows the top ``KEYS_SHOWN`` / ``SESSIONS_SHOWN`` by tokens, the rest in one "other" row:
``/metrics`` label cardinality, ``/status`` and the board's memory stay bounded whatever the clients send.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.serving.scheduling.sessions import Identity

SESSIONS_KEPT = 1024
SESSIONS_SHOWN = 20
KEYS_KEPT = 1024
KEYS_SHOWN = 20
Name = TypeVar("Name", str, tuple[str, str])
OTHER = "other"  # never a key id (key-XXXXXXXX or open) nor a session id (12 hex digits)


@dataclass
class RequestRecord:
    """One request's account, filled in along its way: the edge creates it, the handler names the
    session and the time queued, the edge adds the first output's time and the engine's usage."""

    started: float = field(default_factory=time.perf_counter)
    identity: Identity | None = None
    queued_s: float | None = None
    prefill_estimate: int | None = None  # the gateway's estimate (gateway.serving.scheduling.sessions)
    long: bool = False
    ttft_s: float | None = None

    def first_output(self) -> None:
        """The response's first body bytes went out: record the time. (Not when the engine's prefill
        ended: a translated stream's first event is written before it; the routes watch the engine.)"""
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.started


@dataclass
class Tally:
    """Sums for one key or one session."""

    requests: int = 0
    errors: int = 0  # answered with a status of 400 or more
    evaluated: int = 0  # prompt tokens the engine prefilled
    reused: int = 0  # prompt tokens it took from its prefix cache
    output: int = 0
    queued_s: float = 0.0
    ttft_s: float = 0.0
    ttft_count: int = 0
    agent: str = ""  # the user agent last seen (sessions only)
    named_by: str = ""  # what named the session (sessions only)
    last_seen: float = 0.0

    def add(self, other: Tally) -> None:
        for name in ("requests", "errors", "evaluated", "reused", "output", "queued_s", "ttft_s", "ttft_count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def tokens(self) -> int:
        return self.evaluated + self.reused + self.output

    def row(self) -> dict[str, Any]:
        prompt = self.evaluated + self.reused
        return {
            "requests": self.requests,
            "errors": self.errors,
            "prompt_evaluated": self.evaluated,
            "prompt_reused": self.reused,
            "reused_share": round(self.reused / prompt, 3) if prompt else None,
            "output_tokens": self.output,
            "queue_wait_s_mean": round(self.queued_s / self.requests, 3) if self.requests else None,
            "ttft_s_mean": round(self.ttft_s / self.ttft_count, 3) if self.ttft_count else None,
        }


class UsageBoard:
    def __init__(
        self, *, kept: int = SESSIONS_KEPT, shown: int = SESSIONS_SHOWN, keys_kept: int = KEYS_KEPT,
        keys_shown: int = KEYS_SHOWN,
    ) -> None:  # fmt: skip
        self.kept = kept
        self.shown = shown
        self.keys_kept = keys_kept
        self.keys_shown = keys_shown
        self.keys: collections.OrderedDict[str, Tally] = collections.OrderedDict()
        self.folded_keys = Tally()  # keys pushed out of the board (the oldest), summed
        self.sessions: collections.OrderedDict[tuple[str, str], Tally] = collections.OrderedDict()
        self.folded = Tally()  # sessions pushed out of the board (the oldest), summed

    def add(self, record: RequestRecord, *, status: int, tokens: dict[str, int], agent: str | None) -> None:
        """Count one finished request (tokens: the edge's ``in``/``out``/``cached`` figures)."""
        identity = record.identity
        if identity is None:  # not an inference request (or refused before it was read)
            return
        tally = Tally(
            requests=1,
            errors=int(status >= 400),
            evaluated=max(tokens["in"] - tokens["cached"], 0),
            reused=tokens["cached"],
            output=tokens["out"],
            queued_s=record.queued_s or 0.0,
            ttft_s=record.ttft_s or 0.0,
            ttft_count=int(record.ttft_s is not None and status < 400),
        )
        key = self.keys.pop(identity.key, None) or Tally()
        key.add(tally)
        self.keys[identity.key] = key
        while len(self.keys) > self.keys_kept:
            _, oldest_key = self.keys.popitem(last=False)
            self.folded_keys.add(oldest_key)
        name = (identity.key, identity.session)
        session = self.sessions.pop(name, None) or Tally(named_by=identity.session_from)
        session.add(tally)
        session.agent = (agent or "")[:80]
        session.last_seen = time.time()
        self.sessions[name] = session
        while len(self.sessions) > self.kept:
            _, oldest = self.sessions.popitem(last=False)
            self.folded.add(oldest)

    def top_sessions(self) -> tuple[list[tuple[tuple[str, str], Tally]], Tally]:
        """The sessions with the most tokens, and the rest (and those folded before) summed."""
        return _top(self.sessions, self.shown, self.folded)

    def top_keys(self) -> tuple[list[tuple[str, Tally]], Tally]:
        """The keys with the most tokens (in key order), and the rest (and those folded before) summed."""
        top, rest = _top(self.keys, self.keys_shown, self.folded_keys)
        return sorted(top), rest

    def snapshot(self) -> dict[str, Any]:
        """For /status: per key, and the top sessions (the rest in one row)."""
        top, rest = self.top_sessions()
        sessions = [
            {"key": key, "session": session, "agent": tally.agent, "named_by": tally.named_by, **tally.row()}
            for (key, session), tally in top
        ]
        if rest.requests:
            sessions.append({"key": "", "session": OTHER, "agent": "", "named_by": "", **rest.row()})
        top_keys, other_keys = self.top_keys()
        keys = [{"key": key, **tally.row()} for key, tally in top_keys]
        if other_keys.requests:
            keys.append({"key": OTHER, **other_keys.row()})
        return {"keys": keys, "sessions": sessions}


def _top(table: Mapping[Name, Tally], shown: int, folded: Tally) -> tuple[list[tuple[Name, Tally]], Tally]:
    """The ``shown`` rows of ``table`` with the most tokens, and the rest (with ``folded``) summed."""
    ranked = sorted(table.items(), key=lambda item: item[1].tokens, reverse=True)
    rest = Tally()
    rest.add(folded)
    for _, tally in ranked[shown:]:
        rest.add(tally)
    return ranked[:shown], rest


class BoardCollector(Collector):
    """``/metrics`` per key and per session (the top ones; the rest under session="other")."""

    def __init__(self, board: UsageBoard) -> None:
        self.board = board

    def collect(self) -> Iterator[Any]:
        top, rest = self.board.top_sessions()
        top_keys, other_keys = self.board.top_keys()
        rows: list[tuple[list[str], list[str], Tally]] = [(["key"], [key], tally) for key, tally in top_keys]
        if other_keys.requests:
            rows.append((["key"], [OTHER], other_keys))
        rows += [(["key", "session"], [key, session], tally) for (key, session), tally in top]
        if rest.requests:
            rows.append((["key", "session"], ["", OTHER], rest))
        for scope in ("key", "session"):
            labels = ["key"] if scope == "key" else ["key", "session"]
            mine = [(values, tally) for names, values, tally in rows if names == labels]
            yield from _families(scope, labels, mine)


def _families(scope: str, labels: list[str], rows: list[tuple[list[str], Tally]]) -> Iterator[Any]:
    what = "API key" if scope == "key" else "agent session"
    what += f" (top by tokens; the rest as {scope}=other)"
    requests = CounterMetricFamily(f"gateway_{scope}_requests", f"Inference requests per {what}", labels=labels)
    errors = CounterMetricFamily(f"gateway_{scope}_errors", f"Requests answered >= 400 per {what}", labels=labels)
    prompt = CounterMetricFamily(
        f"gateway_{scope}_prompt_tokens",
        f"Prompt tokens the engine evaluated or reused from its prefix cache, per {what}",
        labels=[*labels, "kind"],
    )
    output = CounterMetricFamily(f"gateway_{scope}_output_tokens", f"Output tokens per {what}", labels=labels)
    queued = CounterMetricFamily(
        f"gateway_{scope}_queue_wait_seconds", f"Time waited for an engine slot, per {what}", labels=labels
    )
    ttft = CounterMetricFamily(
        f"gateway_{scope}_first_output_seconds", f"Time to the first output bytes (sum), per {what}", labels=labels
    )
    answered = GaugeMetricFamily(
        f"gateway_{scope}_first_output_count", f"Requests counted in first_output_seconds, per {what}", labels=labels
    )
    for values, tally in rows:
        requests.add_metric(values, tally.requests)
        errors.add_metric(values, tally.errors)
        prompt.add_metric([*values, "evaluated"], tally.evaluated)
        prompt.add_metric([*values, "reused"], tally.reused)
        output.add_metric(values, tally.output)
        queued.add_metric(values, tally.queued_s)
        ttft.add_metric(values, tally.ttft_s)
        answered.add_metric(values, tally.ttft_count)
    yield from (requests, errors, prompt, output, queued, ttft, answered)
