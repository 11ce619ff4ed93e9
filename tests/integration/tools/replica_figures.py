"""The arithmetic of ``agent_load.py --replicas``: where turns went, one replica against two, and what a
replica lost at half time cost. Kept apart from the runs (no engine, no HTTP) so that a fast test can
check it on rows made by hand (tests/unit/test_replica_figures.py; tests never import benchmarks/).

A row is one turn as ``agent_load.play`` records it: ``session``, ``turn`` (1-based), ``sent_s`` (since
the run began), ``replica`` (the ``x-gateway-replica`` that answered, when the gateway named one),
``ttft_ms``/``total_ms``, and ``error`` (with ``stream_started``: the answer had begun, status 200 sent)
when it failed.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between the two nearest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _in_order(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (str(row["session"]), int(row["turn"])))


def shares(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Turns answered per replica (answered turns only; "-" where no replica was named)."""
    counted = Counter(str(row.get("replica") or "-") for row in rows if "error" not in row)
    return dict(sorted(counted.items()))


def stayed(rows: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """Of the answered turns that follow an answered turn of the same session, how many the same replica
    answered: (stayed, such turns). The affinity the router promises, read from the answers' headers."""
    last: dict[str, str] = {}
    kept = followed = 0
    for row in _in_order(rows):
        if "error" in row:
            continue
        session, replica = str(row["session"]), str(row.get("replica") or "-")
        if session in last:
            followed += 1
            kept += last[session] == replica
        last[session] = replica
    return kept, followed


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 2) if top is not None and bottom else None


def comparison(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (engine, sessions): the one-replica runs against the runs of more, taken in turn in the
    same window. Output tokens/s: the mean of each shape's runs and their ratio, and each round's ratio
    (its many-replica run over the one-replica run of the same round); warm TTFT p95: each shape's worst
    run; later turns within the prefill goal, in %, each shape's worst run. ``load`` is each run's load
    average when it began."""
    out: list[dict[str, Any]] = []
    keys = sorted({(run["engine"], run["sessions"]) for run in runs}, key=lambda key: (key[0], key[1]))
    for engine, sessions in keys:
        mine = [run for run in runs if run["engine"] == engine and run["sessions"] == sessions and not run.get("kill")]
        one = [run for run in mine if run["replicas"] == 1]
        many = [run for run in mine if run["replicas"] > 1]
        if not one or not many:
            continue

        def tps(group: list[dict[str, Any]]) -> list[float]:
            return [run["summary"]["output_tokens_per_s"] or 0.0 for run in group]

        def worst(group: list[dict[str, Any]], name: str, pick: Any) -> float | None:
            values = [run["summary"][name] for run in group if run["summary"][name] is not None]
            return pick(values) if values else None

        rounds = sorted({run["round"] for run in mine})
        per_round = []
        for number in rounds:
            a = [run for run in one if run["round"] == number]
            b = [run for run in many if run["round"] == number]
            if a and b:
                per_round.append(_ratio(tps(b)[0], tps(a)[0]))
        out.append(
            {
                "engine": engine,
                "sessions": sessions,
                "replicas": many[0]["replicas"],
                "runs": f"{len(one)} + {len(many)}",
                "tps_one": [round(v, 2) for v in tps(one)],
                "tps_many": [round(v, 2) for v in tps(many)],
                "tps_ratio": _ratio(_mean(tps(many)), _mean(tps(one))),
                "tps_ratio_per_round": per_round,
                "warm_p95_one_ms": worst(one, "warm_ttft_p95_ms", max),
                "warm_p95_many_ms": worst(many, "warm_ttft_p95_ms", max),
                "goal_pct_one": worst(one, "later_within_goal_pct", min),
                "goal_pct_many": worst(many, "later_within_goal_pct", min),
                "load_one": [run["load"][0] for run in one],
                "load_many": [run["load"][0] for run in many],
            }
        )
    return out


def schedule(shapes: Sequence[int], rounds: int, kill: bool) -> list[tuple[int, int, bool]]:
    """The runs of one session count, in order: (replicas, round, killed at half time). Each round runs
    every shape in turn (one, two, one, two: each ratio from runs in the same window); the kill run, of
    the largest shape, comes last, so that it can be timed at half the same shape's runs."""
    runs = [(replicas, number, False) for number in range(1, rounds + 1) for replicas in shapes]
    if kill and max(shapes, default=1) > 1:
        runs.append((max(shapes), 0, True))
    return runs


def _end_s(row: dict[str, Any]) -> float:
    return float(row["sent_s"]) + float(row["total_ms"]) / 1000


def _replica_at(rows: Sequence[dict[str, Any]], kill_s: float) -> str | None:
    """The replica a session (its rows in turn order) was on at ``kill_s``: its last turn sent by then, or,
    for a turn in flight then and answered (perhaps elsewhere, after a retry), the turn before it."""
    before = [row for row in rows if row["sent_s"] <= kill_s]
    if not before:
        return None
    last = before[-1]
    if _end_s(last) > kill_s and "error" not in last:
        prior = [row for row in before[:-1] if "error" not in row]
        last = prior[-1] if prior else last
    return str(last.get("replica") or "-")


def kill_figures(rows: Sequence[dict[str, Any]], *, killed: str, kill_s: float, stall_s: float) -> dict[str, Any]:
    """What losing replica ``killed`` at ``kill_s`` (seconds into the run) cost. Errors are split into
    streams already started (allowed: each ends with its error event) and the rest (none allowed). The
    killed replica's sessions are those on it at the kill (:func:`_replica_at`) with turns left; for
    each, its first turn answered after the kill (a turn in flight then, retried before its first byte,
    or the next one): by which replica, and how long after the kill or its sending, whichever was later,
    against the stall limit ``stall_s``. Sessions never answered after the kill count against it."""
    failed = [row for row in rows if "error" in row]
    started = [row for row in failed if row.get("stream_started")]
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in _in_order(rows):
        by_session.setdefault(str(row["session"]), []).append(row)
    moved = sorted(
        session
        for session, own in by_session.items()
        if _replica_at(own, kill_s) == killed and any(_end_s(row) > kill_s for row in own)
    )
    answered: list[dict[str, Any]] = []
    waits: list[float] = []
    for session in moved:
        after = [row for row in by_session[session] if "error" not in row and _end_s(row) > kill_s]
        if after:
            answered.append(after[0])
            waits.append(_end_s(after[0]) - max(float(after[0]["sent_s"]), kill_s))
    slowest = max(waits, default=None)
    return {
        "killed": killed,
        "kill_s": round(kill_s, 1),
        "errors": len(failed),
        "errors_stream_started": len(started),
        "errors_before_first_byte": len(failed) - len(started),
        "sessions_on_killed": len(moved),
        "their_next_answer": f"{len(answered)}/{len(moved)}",
        "their_next_answer_by": dict(sorted(Counter(str(row.get("replica") or "-") for row in answered).items())),
        "their_next_answer_slowest_s": round(slowest, 1) if slowest is not None else None,
        "within_stall_limit": bool(moved) and len(answered) == len(moved) and (slowest or 0.0) <= stall_s,
        "stall_limit_s": stall_s,
    }
