"""The arithmetic of ``benchmarks/agent_load.py --replicas`` (tests/integration/tools/replica_figures.py), on
rows made by hand: where turns went, the affinity read from the answers, one replica against two, and a
kill's cost."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.tools.replica_figures import comparison, kill_figures, percentile, schedule, shares, stayed


def turn(session: str, number: int, replica: str | None, sent_s: float = 0.0, total_ms: int = 100) -> dict[str, Any]:
    return {"session": session, "turn": number, "replica": replica, "sent_s": sent_s, "total_ms": total_ms}


def failed(row: dict[str, Any], *, started: bool) -> dict[str, Any]:
    return row | {"error": "boom", **({"stream_started": True} if started else {})}


def test_percentile_interpolates_between_ranks_as_numpy_does() -> None:
    assert percentile([], 95) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 0.0, 20.0], 95) == pytest.approx(19.0)


def test_shares_count_answered_turns_per_replica_only() -> None:
    rows = [turn("a", 1, "1"), turn("b", 1, "2"), turn("a", 2, "1"), failed(turn("b", 2, "2"), started=True)]
    assert shares(rows) == {"1": 2, "2": 1}
    assert shares([turn("a", 1, None)]) == {"-": 1}


def test_stayed_follows_each_session_in_turn_order_whatever_order_rows_finished_in() -> None:
    rows = [
        turn("a", 3, "2"),  # moved: its turn 2 was on 1
        turn("a", 1, "1"),
        turn("b", 2, "2"),
        turn("a", 2, "1"),
        turn("b", 1, "2"),
        failed(turn("b", 3, "1"), started=True),  # a failed turn is not an answer
    ]
    assert stayed(rows) == (2, 3)


def _run(replicas: int, number: int, tps: float, p95: float, goal: float, load: float, **extra: Any) -> dict[str, Any]:
    summary = {"output_tokens_per_s": tps, "warm_ttft_p95_ms": p95, "later_within_goal_pct": goal}
    return {
        "engine": "llamacpp",
        "sessions": 8,
        "replicas": replicas,
        "round": number,
        "load": (load, 0.0, 0.0),
        "summary": summary,
        **extra,
    }


def test_comparison_takes_means_per_round_ratios_and_each_shapes_worst_run() -> None:
    runs = [
        _run(1, 1, 2.0, 900.0, 100.0, 3.0),
        _run(2, 1, 4.0, 800.0, 95.0, 3.5),
        _run(1, 2, 3.0, 1200.0, 90.0, 4.0),
        _run(2, 2, 5.4, 700.0, 100.0, 4.5),
        _run(2, 0, 0.5, 9e9, 0.0, 9.0, kill=True),  # the kill run is not compared
        {**_run(1, 1, 1.0, 1.0, 1.0, 1.0), "sessions": 16},  # no two-replica run at 16: no row
    ]
    (row,) = comparison(runs)
    assert row["runs"] == "2 + 2"
    assert row["tps_ratio"] == pytest.approx(1.88)  # (4 + 5.4) / 2 over (2 + 3) / 2
    assert row["tps_ratio_per_round"] == [2.0, 1.8]
    assert (row["warm_p95_one_ms"], row["warm_p95_many_ms"]) == (1200.0, 800.0)
    assert (row["goal_pct_one"], row["goal_pct_many"]) == (90.0, 95.0)
    assert row["load_one"] == [3.0, 4.0] and row["load_many"] == [3.5, 4.5]


def test_kill_figures_split_errors_and_follow_the_killed_replicas_sessions_to_their_next_answer() -> None:
    rows = [
        turn("a", 1, "1", 0.0, 2_000),  # a on 1 before the kill at 10 s
        turn("a", 2, "2", 9.0, 4_000),  # in flight at the kill, retried before its first byte: answered by 2
        turn("b", 1, "1", 0.0, 3_000),
        failed(turn("b", 2, "1", 8.0, 3_000), started=True),  # its stream broke: allowed
        turn("b", 3, "2", 12.0, 1_500),  # b's next answer: 2, 1.5 s after it was sent
        turn("c", 1, "2", 0.0, 1_000),  # c was on the other replica
        failed(turn("c", 2, "2", 11.0, 200), started=False),  # failed before a byte: not allowed
        turn("d", 1, "1", 0.0, 9_000),  # d was on 1 but had no turn left after the kill: not counted
        failed(turn("e", 1, "1", 1.0, 9_500), started=True),  # e's first turn broke on 1 at the kill
        turn("e", 2, "1", 10.5, 1_000),  # answered by 1 once back, 1 s after it was sent
    ]
    figures = kill_figures(rows, killed="1", kill_s=10.0, stall_s=2.5)
    assert (figures["errors"], figures["errors_stream_started"], figures["errors_before_first_byte"]) == (3, 2, 1)
    assert figures["sessions_on_killed"] == 3
    assert figures["their_next_answer"] == "3/3"
    assert figures["their_next_answer_by"] == {"1": 1, "2": 2}
    assert figures["their_next_answer_slowest_s"] == 3.0  # a's: from the kill (10 s) to its end (13 s)
    assert figures["within_stall_limit"] is False  # 3.0 s > 2.5 s
    assert kill_figures(rows, killed="1", kill_s=10.0, stall_s=300)["within_stall_limit"] is True


def test_a_killed_replicas_session_never_answered_again_is_not_within_the_limit() -> None:
    rows = [turn("a", 1, "1", 0.0, 1_000), failed(turn("a", 2, "1", 5.0, 100), started=True)]
    figures = kill_figures(rows, killed="1", kill_s=4.0, stall_s=300)
    assert figures["their_next_answer"] == "0/1"
    assert figures["within_stall_limit"] is False


def test_the_shapes_run_in_turn_each_round_and_the_kill_run_of_the_largest_comes_last() -> None:
    assert schedule([1, 2], 2, kill=True) == [(1, 1, False), (2, 1, False), (1, 2, False), (2, 2, False), (2, 0, True)]
    assert schedule([1], 1, kill=True) == [(1, 1, False)]  # one engine: nothing to kill
    assert schedule([2], 1, kill=False) == [(2, 1, False)]
