"""The planner against published start-up logs (benchmarks/plan_accuracy.py prints the full table).

The replay itself is tests/replay/plan_accuracy.py, shared with that report."""

from __future__ import annotations

from tests.replay.plan_accuracy import replay_all


def test_available_kv_and_kv_tokens_within_10_percent_of_the_logs() -> None:
    rows, _, _, excluded = replay_all()
    kv = [r for r in rows if r.term in ("available KV GiB", "KV tokens") and r.case not in excluded]
    assert len(kv) >= 7
    assert [r for r in kv if abs(r.error) > 0.10] == []


def test_fit_verdicts_match_what_the_engines_did() -> None:
    rows, _, _, excluded = replay_all()
    verdicts = [r for r in rows if r.term.startswith("verdict") and r.case not in excluded]
    assert len(verdicts) >= 6 and all(r.predicted == r.reported for r in verdicts)


def test_exact_kv_arithmetic_matches_to_one_percent() -> None:
    rows, _, _, _ = replay_all()
    exact = [r for r in rows if r.term.startswith(("KV for one", "estimated max", "KV cache MiB"))]
    assert len(exact) == 5 and all(abs(r.error) <= 0.01 for r in exact)


def test_cuda_totals_derived_from_nvml_match_the_logged_totals() -> None:
    rows, _, _, _ = replay_all()
    totals = [r for r in rows if r.term == "CUDA total GiB"]
    assert len(totals) >= 3 and all(abs(r.predicted - r.reported) <= 0.07 for r in totals)
