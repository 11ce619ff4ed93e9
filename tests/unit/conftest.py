"""The real huggingface_hub client pointed at the local hub inside this test process.

``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` once, at import; a
subprocess gets them in its environment, a test in this process sets the constants they became
(endpoint, URL template, the cache) and clears the gateway's per-process memory of searches. Offline
mode follows the environment in every test, so a test's ``setenv("HF_HUB_OFFLINE", "1")`` holds
whichever test imported huggingface_hub first (without it such a test would reach the real hub)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.hub import search
from gateway.supervision import engine_run, remote_run
from tests.integration.tools.local_hub import LocalHub, running
from tests.unit.http_harness import FakeEngine, Served


@pytest.fixture(autouse=True)
def offline_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(
        constants, "is_offline_mode", lambda: os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    )


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's health is asked again every 50 ms, not every half second: a poll only says how soon a
    change is seen (no deadline is shortened), and the engine stand-ins answer at once."""
    monkeypatch.setattr(engine_run, "POLL_INTERVAL_S", 0.05)
    monkeypatch.setattr(remote_run, "HEALTH_POLL_S", 0.05)


@pytest.fixture(scope="session")
def local_hub() -> Iterator[tuple[str, LocalHub]]:
    with running() as served:
        yield served


@pytest.fixture
def hub(local_hub: tuple[str, LocalHub], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalHub:
    """The client aimed at the local hub with an empty cache under tmp_path; the hub's request log."""
    from huggingface_hub import constants

    url, served = local_hub
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(search, "_SEARCHES", {})
    served.requests.clear()
    return served


@pytest.fixture(scope="module")
def served_engine() -> Iterator[tuple[FakeEngine, str]]:
    """One stand-in engine on a loopback port per test module (the HTTP tests' upstream)."""
    engine = FakeEngine()
    server = Served(engine.app, lifespan="off")
    yield engine, server.url
    server.stop()


@pytest.fixture
def engine(served_engine: tuple[FakeEngine, str]) -> FakeEngine:
    served_engine[0].reset()
    return served_engine[0]


@pytest.fixture
def engine_url(served_engine: tuple[FakeEngine, str]) -> str:
    return served_engine[1]
