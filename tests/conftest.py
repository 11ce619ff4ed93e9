"""Shared fixtures: a clean environment for every test (no GATEWAY_* or proxy variables leak in)."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator

import pytest

# The project's and the tests' compiled modules are kept (__pycache__/, ignored by git and the image):
# with PYTHONDONTWRITEBYTECODE set, as on the shared machine, every run compiled gateway/ and gateway/backends/
# and rewrote the test modules' asserts afresh, 3.7 s of CPU of the fast suite.
sys.dont_write_bytecode = False

# The whole suite runs on two workers, a module at a time each (scripts/test: -n 2 --dist loadfile
# --no-loadscope-reorder); its longest modules start first, so that neither worker is left with a long
# one at the end. Measured serially on this 2-core machine, in seconds; the rest keep their order after.
LONGEST_MODULES = (
    "tests/integration/test_agents_real.py",  # ~540: the default model reads each agent's prompt on one thread
    "tests/integration/test_vllm_supervisor.py",  # ~300: four vLLM starts
    "tests/integration/test_warm_sessions.py",  # ~220
    "tests/integration/test_vllm_multinode.py",  # ~175
    "tests/integration/test_image.py",  # ~105
    "tests/integration/test_serve_native.py",
    "tests/integration/test_multinode.py",
)

_LEAKY_PREFIXES = ("GATEWAY_",)
_LEAKY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (see LONGEST_MODULES), each module's tests in their own order."""
    rank = {name: place for place, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported (every module, the tests, the hub's data) lives as long as the run: the
    garbage collector stops walking it at each full collection (gc.freeze), which took 1.7 s of the fast
    suite's CPU; what the tests make is collected as before."""
    gc.freeze()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in _LEAKY_NAMES:
            monkeypatch.delenv(name)
    yield
