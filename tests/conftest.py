"""Shared fixtures: a clean environment for every test (no GATEWAY_* or proxy variables leak in)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# The project's and the tests' compiled modules are kept (__pycache__/, ignored by git and the image):
# with PYTHONDONTWRITEBYTECODE set, as on the shared machine, every run compiled gateway/ and backends/
# and rewrote the test modules' asserts afresh, 3.7 s of CPU of the fast suite.
sys.dont_write_bytecode = False

_LEAKY_PREFIXES = ("GATEWAY_",)
_LEAKY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in _LEAKY_NAMES:
            monkeypatch.delenv(name)
    yield
