"""What ``/status``, the status page and ``/metrics`` show of the replicas (issue 50, item 5): per replica its
node, devices, state, sessions bound, queue, warm share, TTFT and moves; and the pool's totals. Two
replicas are injected into the runtime's pool (the gateway in front of the fake engine, in this process),
their counters set through the pool's own leases; with one engine the pages stay as they were."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.routing.pool import Health, Placement, Pool, Replica, ReplicaCounters, Why
from gateway.serving.routing.ttft import RECENT, TtftRecord
from gateway.serving.runtime import Runtime, Upstream
from tests.unit.http_harness import FakeEngine, Served, make_runtime

TTFTS = [round(0.1 * k, 1) for k in range(1, 21)]  # 0.1 … 2.0 s: mean 1.05, nearest-rank p95 1.9


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    served = Served(FakeEngine().app)
    yield served.url
    served.stop()


def two_replicas(runtime: Runtime) -> Pool[Upstream]:
    """The runtime's pool made of two replicas on two nodes: ``r1`` serving, with its counters, load and
    sessions; ``r2`` restarting, with nothing yet."""
    upstream = runtime.pool.replicas[0].upstream  # both send through the one fake engine: only the figures differ
    r1 = Replica("r1", upstream, node="head", devices=("0", "1"))
    r2 = Replica("r2", upstream, node="node2", devices=("node2/0", "node2/1"))
    pool = Pool([r1, r2], balance=runtime.balance)
    r1.counters = ReplicaCounters(requests=12, warm=6, parent=1, prefix=1, least_loaded=1, moved_load=1, moved_down=1)
    r1.counters.retry = 1
    r1.counters.failed = 2
    r2.counters = ReplicaCounters(requests=2, least_loaded=1, moved_down=1, failed=1)
    for seconds in TTFTS:
        lease = Placement(r1, Why.WARM)
        lease.admitted()
        lease.first_output(seconds)
        lease.release()
    Placement(r1, Why.WARM).admitted()  # three in the engine, two waiting for a slot
    Placement(r1, Why.WARM).admitted()
    Placement(r1, Why.WARM).admitted()
    Placement(r1, Why.WARM)
    Placement(r1, Why.WARM)
    for conversation in ("a", "b", "c"):
        pool.bindings.bind(conversation, "r1", r1.generation, conversation=True)
    pool.bindings.bind("d", "r2", r2.generation, conversation=True)
    pool.bindings.bind("parent-of-d", "r2", r2.generation, conversation=False)
    r2.mark(Health.STARTING)
    runtime.pool = pool
    return pool


def fetch(runtime: Runtime) -> tuple[dict[str, object], str, str]:
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        status = client.get("/status").json()
        page = client.get("/status?format=html").text
        metrics = client.get("/metrics").text
    return status, page, metrics


class Tables(HTMLParser):
    """The page's tables under each heading id: rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._section = dict(attrs).get("id") or ""
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables.setdefault(self._section, []).append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def replica_rows(page: str) -> dict[str, dict[str, str]]:
    tables = Tables()
    tables.feed(page)
    head, *rows = tables.tables["replicas"]
    return {row[0]: dict(zip(head, row, strict=True)) for row in rows}


def test_status_lists_each_replica_and_the_pools_totals(engine_url: str) -> None:
    runtime = make_runtime(engine_url)
    two_replicas(runtime)
    status, _page, _metrics = fetch(runtime)
    pool = status["pool"]
    assert isinstance(pool, dict)
    rows = {row["name"]: row for row in pool["replicas"]}
    r1, r2 = rows["r1"], rows["r2"]
    assert (r1["node"], r1["devices"], r1["state"]) == ("head", ["0", "1"], "up")
    assert (r2["node"], r2["devices"], r2["state"]) == ("node2", ["node2/0", "node2/1"], "starting")
    assert (r1["sessions_bound"], r2["sessions_bound"]) == (3, 1)  # conversations, not the parent bound
    assert (r1["queued"], r1["active"], r2["queued"], r2["active"]) == (2, 3, 0, 0)
    assert r1["warm_share"] == round(6 / 8, 3) and r2["warm_share"] == 0.0
    assert (r1["ttft_s_mean"], r1["ttft_s_p95"]) == (1.05, 1.9)
    assert (r2["ttft_s_mean"], r2["ttft_s_p95"]) == (None, None)
    assert (r1["moved_load"], r1["moved_down"], r1["retry"], r1["failed"]) == (1, 1, 1, 2)
    totals = pool["totals"]
    assert (totals["requests"], totals["queued"], totals["active"], totals["bindings"]) == (14, 2, 3, 5)
    assert (totals["moved_down"], totals["failed"], totals["warm_share"]) == (2, 3, round(6 / 9, 3))
    assert totals["ttft_s_p95"] == 1.9
    assert pool["balance"] == {"abs_threshold": 64, "rel_threshold": 1.5}


def test_the_status_page_has_a_row_per_replica_and_one_for_the_pool(engine_url: str) -> None:
    runtime = make_runtime(engine_url)
    two_replicas(runtime)
    _status, page, _metrics = fetch(runtime)
    rows = replica_rows(page)
    assert list(rows) == ["r1", "r2", "all"]
    r1, r2, everything = rows["r1"], rows["r2"], rows["all"]
    assert (r1["node"], r1["devices"], r1["state"]) == ("head", "0, 1", "up")
    assert (r2["node"], r2["devices"], r2["state"]) == ("node2", "node2/0, node2/1", "starting")
    assert (r1["sessions_bound"], r1["queued"], r1["active"]) == ("3", "2", "3")
    assert (r1["warm_share"], r1["ttft_s_mean"], r1["ttft_s_p95"]) == ("0.75", "1.05", "1.9")
    assert (r1["moved_load"], r1["moved_down"], r1["retry"], r1["failed"]) == ("1", "1", "1", "2")
    assert r2["ttft_s_p95"] == "" and r2["requests"] == "2"
    assert (everything["requests"], everything["queued"], everything["failed"]) == ("14", "2", "3")
    assert "more than 64 requests and 1.5 times" in page


def metric_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if not line.startswith("#")}


def test_metrics_give_each_replica_with_bounded_labels(engine_url: str) -> None:
    runtime = make_runtime(engine_url)
    two_replicas(runtime)
    _status, _page, metrics = fetch(runtime)
    lines = metric_lines(metrics)
    for line in (
        'gateway_replica_info{devices="0,1",node="head",replica="r1"} 1.0',
        'gateway_replica_info{devices="node2/0,node2/1",node="node2",replica="r2"} 1.0',
        'gateway_replica_state{replica="r1",state="up"} 1.0',
        'gateway_replica_state{replica="r2",state="starting"} 1.0',
        'gateway_replica_state{replica="r2",state="up"} 0.0',
        'gateway_replica_sessions_bound{replica="r1"} 3.0',
        'gateway_replica_queued{replica="r1"} 2.0',
        'gateway_replica_active{replica="r1"} 3.0',
        'gateway_replica_warm_share{replica="r1"} 0.75',
        'gateway_replica_requests_total{replica="r1",why="warm"} 6.0',
        'gateway_replica_requests_total{replica="r1",why="moved_load"} 1.0',
        'gateway_replica_requests_total{replica="r2",why="moved_down"} 1.0',
        'gateway_replica_requests_total{replica="r1",why="retry"} 1.0',
        'gateway_replica_failed_total{replica="r1"} 2.0',
        'gateway_replica_ttft_seconds_bucket{le="1.0",replica="r1"} 10.0',
        'gateway_replica_ttft_seconds_bucket{le="+Inf",replica="r1"} 20.0',
        'gateway_replica_ttft_seconds_count{replica="r1"} 20.0',
        'gateway_replica_ttft_seconds_count{replica="r2"} 0.0',
        "gateway_pool_bindings 5.0",
    ):
        assert line in lines, line
    sum_line = next(line for line in lines if line.startswith('gateway_replica_ttft_seconds_sum{replica="r1"}'))
    assert float(sum_line.split()[-1]) == pytest.approx(sum(TTFTS))
    # every replica series is labelled by the plan's names only: two replicas, three states, seven reasons
    replica_series = [line for line in lines if line.startswith("gateway_replica_")]
    assert set(re.findall(r'replica="([^"]+)"', "\n".join(replica_series))) == {"r1", "r2"}
    assert all('replica="' in line for line in replica_series)
    assert len([line for line in replica_series if line.startswith("gateway_replica_requests_total")]) == 2 * 7
    assert "gateway_queue_depth 0.0" in lines  # the one-engine figures are still there, as they were


def test_one_engine_shows_what_it_showed(engine_url: str) -> None:
    status, page, metrics = fetch(make_runtime(engine_url))
    assert "pool" not in status
    assert "id='replicas'" not in page and "Replicas" not in page
    assert "gateway_replica_" not in metrics and "gateway_pool_" not in metrics


def test_a_replicas_ttft_memory_is_bounded() -> None:
    record = TtftRecord()
    for _ in range(RECENT):
        record.observe(9.0)
    for _ in range(RECENT):
        record.observe(0.2)
    assert len(record.recent) == RECENT and record.p95() == 0.2  # the latest answers, not the uptime's
    assert record.count == 2 * RECENT and record.cumulative()[-1] == ("+Inf", 2.0 * RECENT)
    assert dict(record.cumulative())["0.25"] == RECENT and dict(record.cumulative())["10.0"] == 2 * RECENT
    assert TtftRecord().p95() is None
