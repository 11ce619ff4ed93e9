"""Every background task is supervised (issue 41, item 1): an exception nobody foresaw in the supervisor,
a re-plan, a survey or a poll loop is logged with its traceback and becomes a state ``/ready`` explains,
which recovers when the cause goes. Before, a survey raising ``AttributeError`` during a re-plan ended
the supervisor task silently: "starting" with no reason, every request 503, for ever."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.backends.base import Launch
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.nodes.survey import NodeReport, Nodes
from gateway.supervision.external import ExternalBackend
from gateway.supervision.lifecycle import State
from tests.unit.test_multinode import _answer_if, _cpu_head, answering, serves_then_dies_lost
from tests.unit.test_supervisor_transitions import Clock, Engines, _llama, _run, _supervisor, _until, fails, serves


def _flaky_replan(failures: int, exc: BaseException) -> tuple[Any, list[int]]:
    """A re-plan that raises ``exc`` its first ``failures`` times (a worker's answer nobody checked),
    then plans one llama.cpp option."""
    calls: list[int] = []
    left = _llama(rpc=("a:50052",), launcher=NATIVE)

    async def replan() -> tuple[list[Any], dict[str, Any]]:
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return [left], {"decision": "a alone"}

    return replan, calls


@pytest.mark.parametrize(
    "exc", [AttributeError("'list' object has no attribute 'get'"), OverflowError("cannot convert float infinity"),
            RecursionError("maximum recursion depth exceeded")],
    ids=["attribute", "overflow", "recursion"],
)  # fmt: skip
def test_a_replan_that_raises_is_logged_explained_and_tried_again_until_it_works(
    tmp_path: Path, exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    flaky, calls = _flaky_replan(2, exc)
    seen: list[tuple[State, str | None]] = []  # what /ready said as each re-plan began

    async def replan() -> tuple[list[Any], dict[str, Any]]:
        seen.append((supervisor.state, supervisor.reason))
        return await flaky()

    pooled = _llama(rpc=("a:50052", "b:50052"), launcher=NATIVE)
    engines = Engines(serves_then_dies_lost(), serves())
    supervisor = _supervisor([pooled], engines, tmp_path, replan=replan)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 2 and supervisor.state is State.READY)
        await supervisor.stop()

    with caplog.at_level(logging.ERROR, "gateway.supervisor"):
        _run(scenario)
    # the second try began with the first one's error explained (read there, not polled for: the three tries
    # can all pass between two polls)
    state, reason = seen[1]
    assert state is State.RESTARTING and "unexpected" in (reason or "") and type(exc).__name__ in (reason or "")
    assert len(calls) == 3 and supervisor.reason is None and supervisor.state is State.STOPPED
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is type(exc)]
    assert len(logged) == 2, "each unexpected error is logged with its traceback"


def test_an_unexpected_error_backs_off_and_the_backoff_resets_once_it_serves(tmp_path: Path) -> None:
    replan, _calls = _flaky_replan(3, AttributeError("x"))
    clock = Clock()
    engines = Engines(serves_then_dies_lost(), serves())
    supervisor = _supervisor([_llama(launcher=NATIVE)], engines, tmp_path, replan=replan, sleep=clock.sleep)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 2 and supervisor.state is State.READY)
        await supervisor.stop()

    _run(scenario)
    # the restart's own backoff (1 s), then one per unexpected error, growing
    assert clock.slept == [1.0, 1.0, 2.0, 5.0] and supervisor._unexpected == 0


def test_a_start_that_fails_after_an_unexpected_error_is_restarted_not_given_up_for_good(tmp_path: Path) -> None:
    """Issue 47: once it has served, a failed start after an unexpected error goes the restart way (the
    budget, then long retries) instead of giving up for good as at the first start."""
    replan, calls = _flaky_replan(1, AttributeError("x"))
    engines = Engines(serves_then_dies_lost(), fails(), serves())
    supervisor = _supervisor([_llama(launcher=NATIVE)], engines, tmp_path, replan=replan)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 3 and supervisor.state is State.READY)
        await supervisor.stop()

    _run(scenario)
    assert [a.outcome for a in supervisor.attempts] == ["ready", "failed", "ready"] and len(calls) == 3


def test_a_node_check_that_raises_is_logged_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = Nodes(
        ["a:1"],
        "key",
        fetcher=answering(lambda address, key: _answer_if(True, address)),
        prober=answering(lambda a: True),
    )
    asyncio.run(nodes.survey(_cpu_head()))
    checks: list[int] = []

    async def broken_check() -> list[str]:
        checks.append(1)
        raise TypeError("a bug in the check")

    nodes.check = broken_check  # type: ignore[method-assign]
    replan, _ = _flaky_replan(0, AttributeError())
    engines = Engines(serves())
    supervisor = _supervisor([_llama(launcher=NATIVE)], engines, tmp_path, replan=replan, nodes=nodes, node_check_s=0)

    def failed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "checking the nodes failed" in r.getMessage()]

    async def scenario() -> None:
        await supervisor.start()
        # three failures logged (each counted its call before its error was logged)
        await _until(lambda: len(failed()) >= 3)
        assert supervisor.state is State.READY and not engines.runs[0].stopped and len(checks) >= 3
        await supervisor.stop()

    with caplog.at_level(logging.ERROR, "gateway.supervisor"):
        _run(scenario)
    assert sum(1 for r in failed() if r.exc_info) == 1, "the traceback once in a row"


def test_a_survey_whose_fetch_raises_plans_without_that_worker_and_names_it(caplog: pytest.LogCaptureFixture) -> None:
    async def fetcher(address: str, _key: str | None) -> NodeReport:
        if address == "b:1":
            raise RecursionError("maximum recursion depth exceeded")
        return _answer_if(True, address)

    nodes = Nodes(["a:1", "b:1"], "key", fetcher=fetcher)
    with caplog.at_level(logging.WARNING, "gateway.nodes"):
        inventory = asyncio.run(nodes.survey(_cpu_head()))
    assert [d.node for d in inventory.remote] == ["a"]
    assert any("b:1" in note and "RecursionError" in note for note in inventory.notes)
    assert any(r.exc_info and "b:1" in r.getMessage() for r in caplog.records)


def test_an_external_backends_poll_survives_an_unexpected_error_and_recovers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    launch = Launch(
        engine="external", argv=[], port=0, api_key="", served_name="m", context_length=4096,
        health_path="/v1/models", summary="a server the user runs", base="http://127.0.0.1:9",
    )  # fmt: skip
    answers: list[Any] = [ValueError("a bug"), ValueError("a bug"), 200]
    seen: list[tuple[State, str | None]] = []  # what /ready said as each poll began

    async def get(self: httpx.AsyncClient, url: str, **kwargs: Any) -> httpx.Response:
        seen.append((backend.state, backend.reason))
        answer = answers.pop(0) if answers else 200
        if isinstance(answer, BaseException):
            raise answer
        return httpx.Response(answer)

    monkeypatch.setattr(httpx.AsyncClient, "get", get)
    monkeypatch.setattr("gateway.supervision.external.POLL_S", 0.001)
    backend = ExternalBackend(launch)

    async def scenario() -> None:
        await backend.start()
        await _until(lambda: backend.state is State.READY)
        await backend.stop()

    with caplog.at_level(logging.ERROR, "gateway.external"):
        _run(scenario)
    # the second poll began with the first one's error explained (read there: both errors and the answer that
    # recovers can pass between two of the test's polls)
    assert seen[1][0] is State.STARTING and "ValueError" in (seen[1][1] or "")
    assert any(r.exc_info for r in caplog.records)
