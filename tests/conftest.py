"""Shared fixtures: a clean environment for every test (no GATEWAY_* or proxy variables leak in)."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Iterator

import pytest

# The project's and the tests' compiled modules are kept (__pycache__/, ignored by git and the image):
# with PYTHONDONTWRITEBYTECODE set, as on the shared machine, every run compiled gateway/ and gateway/backends/
# and rewrote the test modules' asserts afresh, 3.7 s of CPU of the fast suite.
sys.dont_write_bytecode = False
# ...and the processes the tests start (gateways, workers, engine stand-ins, mypy) keep theirs too: each
# imported what the test process never does (the CLI, uvicorn's server) and compiled it again, ~4 s of CPU.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The suite runs on two workers, a module at a time each (-n 2 --dist loadfile); its longest modules
# start first, so that neither worker is left with a long one at the end (pytest_configure keeps this
# order: xdist's own puts the modules with the most tests first, and the fast suite's few-test modules
# that wait on clocks, 1.5-2.5 s each, came last: one worker ran on 2-3 s after the other had finished).
# Measured on this 2-core machine, in seconds: the engines' serially, the fast ones on two workers
# beside other work; the rest keep their order after.
LONGEST_MODULES = (
    "tests/integration/test_agents_real.py",  # ~540: the default model reads each agent's prompt on one thread
    "tests/integration/test_vllm_supervisor.py",  # ~300: four vLLM starts
    "tests/integration/test_warm_sessions.py",  # ~220
    "tests/integration/test_vllm_multinode.py",  # ~175
    "tests/integration/test_image.py",  # ~105
    "tests/integration/test_serve_native.py",
    "tests/integration/test_multinode.py",
    "tests/unit/test_plan_hub_models.py",  # ~7.3: the planner on 72 (model, machine) rows
    "tests/unit/test_plan_replicas.py",  # ~1.8
    "tests/unit/test_stop_signals.py",  # ~1.8: two gateway processes
    "tests/unit/test_http_drain.py",  # ~1.8: a grace of 0.5 s
    "tests/unit/test_http_connections.py",  # ~1.7: clocks of 0.35 s (the five scenarios at once)
    "tests/unit/test_http_bad_input.py",  # ~1.6
    "tests/unit/test_agent_requests_replay.py",  # ~1.6
    "tests/unit/test_worker_hardening.py",  # ~1.4
    "tests/unit/test_known_good.py",  # ~1.4
    "tests/unit/test_engine_run.py",  # ~1.2: start graces
    "tests/unit/test_hub_hostile.py",  # ~1.2
    "tests/unit/test_code_quality.py",  # ~1.0: ruff and mypy
    "tests/unit/test_plan_cli.py",  # ~1.0
    "tests/unit/test_docs.py",  # ~0.9: the manual built
    "tests/unit/test_replica_on_node.py",  # ~0.9: engine stand-ins started as processes
    "tests/unit/test_scheduler.py",  # ~0.8; every other fast module less (seconds: one run on two workers)
)


def _exit_without_teardown() -> None:
    """A worker's results are with the controller once it is told to stop, and the controller waits for its
    process to end: the interpreter's teardown (freeing all the tests made, 0.7 s) only delayed the summary."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if os.environ.get("PYTEST_XDIST_WORKER"):  # an xdist worker only: a run of its own sets its exit status at the end
    atexit.register(_exit_without_teardown)

_LEAKY_PREFIXES = ("GATEWAY_",)
_LEAKY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def pytest_configure(config: pytest.Config) -> None:
    """With ``--dist loadfile`` the modules go out in collection order (LONGEST_MODULES first), as if
    ``--no-loadscope-reorder`` were given, unless ``--loadscope-reorder`` is."""
    if config.getoption("dist", None) == "loadfile" and "--loadscope-reorder" not in config.invocation_params.args:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (see LONGEST_MODULES), each module's tests in their own order."""
    rank = {name: place for place, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported (every module, the tests, the hub's data) lives as long as the run: the
    garbage collector stops walking it at each full collection (gc.freeze), which took 1.7 s of the fast
    suite's CPU. What the tests make is collected as before, in larger steps: at Python's default of a
    young collection per 700 allocations the two workers spent 3.3 s of CPU in 4,300 collections (the
    planner's tests allocate by the million); at 20,000, 2.1 s in 800."""
    gc.freeze()
    gc.set_threshold(20_000, 50, 20)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in _LEAKY_NAMES:
            monkeypatch.delenv(name)
    yield
