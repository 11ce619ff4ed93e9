"""What the gateway shows about its use stays bounded and never stalls serving (issue 47): the usage board's
key table keeps and shows a bounded number of keys (the rest folded into ``other``, as sessions are), and
``/metrics`` is written off the event loop, so scrapes at once leave ``/health`` answered."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.serving import metrics as metrics_module
from gateway.serving.app import create_app
from gateway.serving.runtime import Runtime
from gateway.serving.scheduling.sessions import Identity
from gateway.serving.scheduling.usage_board import BoardCollector, RequestRecord, UsageBoard
from tests.unit.http_harness import FakeEngine, Served, make_runtime
from tests.unit.test_http_gateway import _gateway
from tests.waiting import wait_until

TOKENS = {"in": 10, "out": 2, "cached": 4}


def _finish(board: UsageBoard, key: str, session: str = "s") -> None:
    record = RequestRecord(identity=Identity(session, "x-session-id", key))
    board.add(record, status=200, tokens=TOKENS, agent="test")


def test_the_key_table_is_bounded_and_folds_the_rest() -> None:
    board = UsageBoard(keys_kept=5, keys_shown=2)
    for n in range(50):
        _finish(board, f"key-{n:08x}")
    assert len(board.keys) == 5, "the board kept every key it was ever shown"
    rows = board.snapshot()["keys"]
    assert len(rows) == 3 and rows[-1]["key"] == "other"
    assert sum(row["requests"] for row in rows) == 50  # nothing lost: folded, not dropped
    registry = CollectorRegistry()
    registry.register(BoardCollector(board))
    text = generate_latest(registry).decode()
    assert text.count("gateway_key_requests_total{") == 3 and 'gateway_key_requests_total{key="other"} 48.0' in text


def test_a_key_seen_again_stays_on_the_board() -> None:
    board = UsageBoard(keys_kept=2, keys_shown=2)
    for key in ("key-aaaaaaaa", "key-bbbbbbbb", "key-aaaaaaaa", "key-cccccccc"):
        _finish(board, key)
    assert list(board.keys) == ["key-aaaaaaaa", "key-cccccccc"] and board.folded_keys.requests == 1


@pytest.fixture
def gateway() -> Iterator[tuple[Runtime, Served]]:
    engine = FakeEngine()
    engine_server = Served(engine.app)
    runtime = make_runtime(engine_server.url)
    served = Served(create_app(runtime))
    try:
        yield runtime, served
    finally:
        served.stop()
        engine_server.stop()


def _get(url: str) -> tuple[float, bytes]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = answer.read()
    return time.monotonic() - started, body


def test_three_scrapes_at_once_leave_health_answered(
    gateway: tuple[Runtime, Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exposition that is slow to write (16.9 MB of labels took 2.2 s before the labels were bounded)
    is written in a thread: /health stays well under 0.5 s while three scrapes wait for it. The writing
    here lasts until /health has answered three times (10 s at most): written on the loop, each /health
    would wait those 10 s."""
    _, served = gateway
    real = generate_latest

    writing, written = threading.Event(), threading.Event()

    def slow(registry: object) -> bytes:
        writing.set()
        written.wait(timeout=10)  # the slow exposition itself, held until the test has its answers
        return real(registry)  # type: ignore[arg-type]

    monkeypatch.setattr(metrics_module, "generate_latest", slow)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        scrapes = [pool.submit(_get, served.url + "/metrics") for _ in range(3)]
        wait_until(writing.is_set, what="the exposition to be written")
        health = [_get(served.url + "/health")[0] for _ in range(3)]
        still_writing = not any(scrape.done() for scrape in scrapes)
        written.set()
        bodies = [scrape.result()[1] for scrape in scrapes]
    assert still_writing and all(b"gateway_queue_depth" in body for body in bodies)
    assert max(health) < 0.5, f"/health took {max(health):.2f} s during the scrapes"


def test_scrapes_at_once_share_one_exposition(gateway: tuple[Runtime, Served], monkeypatch: pytest.MonkeyPatch) -> None:
    _, served = gateway
    real = generate_latest
    written: list[float] = []

    def counted(registry: object) -> bytes:
        written.append(time.monotonic())
        time.sleep(0.3)  # a slow exposition, that the three scrapes (sent at once) arrive during
        return real(registry)  # type: ignore[arg-type]

    monkeypatch.setattr(metrics_module, "generate_latest", counted)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(_get, [served.url + "/metrics"] * 3))
    assert len(written) < 3, "every scrape wrote its own exposition"
    assert all(b"gateway_backend_state" in body for _, body in results)


def test_status_lists_the_latest_engine_events_only(engine: FakeEngine, engine_url: str) -> None:
    """A gateway up for months may restart its engine thousands of times: /status stays a page."""
    runtime = make_runtime(engine_url)
    attempts = [{"number": n, "engine": "fake", "label": "x", "outcome": "died"} for n in range(1, 2001)]
    hangs = [{"at": "00:00:00", "engine": "fake", "why": "no progress"}] * 300
    snapshot = runtime.backend.snapshot()
    runtime.backend.snapshot = lambda: {**snapshot, "attempts": attempts, "hangs": hangs}  # type: ignore[method-assign]
    with _gateway(runtime) as client:
        status = client.get("/status").json()
        page = client.get("/status?format=html").text
    assert [a["number"] for a in status["attempts"]] == list(range(1951, 2001)) and status["attempts_not_shown"] == 1950
    assert len(status["hangs"]) == 50 and status["hangs_not_shown"] == 250
    assert page.count("<td>died</td>") == 50 and len(attempts) == 2000  # the supervisor's own list is untouched
