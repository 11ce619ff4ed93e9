"""The Dockerfile's CPU twin, built with podman from the same file (scripts/build-cpu-image: other
build arguments, every line shared) and run as a user runs the GPU image: the embedded default model
answers through the published port, a stop drains and exits 0 with the engine stopped by the gateway,
a second container on the same volume neither downloads nor plans again, and a bad --model exits
with its one-line error. A machine where podman cannot run a container skips, saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gatewayproc import free_port

pytestmark = [pytest.mark.image, pytest.mark.engine, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-cpu-image"
TAG = f"localhost/gateway-cpu:test-{os.getpid()}"
GRACE_S = 30.0  # --shutdown-grace: what a request in flight gets when the container is stopped
ENGINE_STOP_S = 5.0  # the engine's SIGTERM wait after the drain (gateway.cli.startup.ENGINE_TERM_WAIT_S)
# a proxy's CA, where the host has one, reaches pip and the hub client in the container the way the
# README says: the host's bundle mounted over the image's
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
MODEL = "smollm2-135m-instruct"  # the embedded default, served with no --model on a machine without GPUs


def podman_env() -> dict[str, str]:
    """./scripts/test writes .podman/containers.conf (runc, ulimits this host allows) and points
    CONTAINERS_CONF at it; a test run without it finds it all the same."""
    env = dict(os.environ)
    written = ROOT / ".podman" / "containers.conf"
    if "CONTAINERS_CONF" not in env and written.is_file():
        env["CONTAINERS_CONF"] = str(written)
    return env


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env(), check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


@dataclass(frozen=True)
class Built:
    tag: str
    build_s: float
    size_bytes: int


@pytest.fixture(scope="module")
def image() -> Iterator[Built]:
    """The CPU twin, built once for the module and removed afterwards (the cached base stays)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: ./scripts/test installs podman, runc and debootstrap with apt")
    info = podman("info", check=False)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {last_line(info.stderr)}")
    base = subprocess.run(
        [str(BUILD), "--base"], capture_output=True, text=True, timeout=900, env=podman_env(), check=False
    )
    if base.returncode != 0:
        pytest.skip(f"no base image for the CPU twin: {last_line(base.stderr or base.stdout)}")
    probe = podman("run", "--rm", last_line(base.stdout), "true", check=False)
    if probe.returncode != 0:
        pytest.skip(
            f"podman cannot run a container here ({last_line(probe.stderr)}): ./scripts/test writes the "
            'containers.conf it needs (runtime = "runc", default_ulimits within this host\'s hard limits)'
        )
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD), TAG], capture_output=True, text=True, timeout=2400, env=podman_env(), check=False
    )
    build_s = time.monotonic() - started
    assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-6000:]
    assert "not compiling" in build.stdout or "compiling llama.cpp in the image" in build.stdout
    size = int(podman("image", "inspect", "--format", "{{.Size}}", TAG).stdout.strip())
    print(f"\nCPU twin {TAG}: built in {build_s:.0f} s, {size / 1e6:.0f} MB")
    try:
        yield Built(TAG, build_s, size)
    finally:
        podman("rmi", "-f", TAG, check=False)


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"gateway-test-{uuid.uuid4().hex[:12]}"
    podman("volume", "create", name)
    try:
        yield name
    finally:
        podman("volume", "rm", "-f", name, check=False)


class Container:
    """One `podman run -d` of the image, removed on exit however the test ends."""

    def __init__(self, image: str, volume: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.name = f"gateway-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ca = ["-v", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"] if HOST_CA_BUNDLE.is_file() else []
        self.argv = [
            "run", "-d", "--name", self.name, "-p", f"127.0.0.1:{self.port}:8000",
            "-v", f"{volume}:/var/lib/gateway", *ca,
            *[f"--env={key}={value}" for key, value in (env or {}).items()],
            image, "--shutdown-grace", str(GRACE_S), *args,
        ]  # fmt: skip

    def __enter__(self) -> Container:
        podman(*self.argv)
        return self

    def __exit__(self, *_: object) -> None:
        podman("rm", "-f", "-v", "-t", "0", self.name, check=False)  # -v: the image's anonymous volumes too

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def state(self) -> dict[str, Any]:
        return dict(json.loads(podman("inspect", "--format", "{{json .State}}", self.name).stdout))

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Seconds from now until /ready says 200 through the published port."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if not self.state().get("Running"):
                raise AssertionError(f"the container exited ({self.state().get('ExitCode')}):\n{self.logs()}")
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"not ready after {timeout_s} s:\n{self.logs()}")


def chat(url: str, text: str, max_tokens: int = 24) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def engine_logs(volume: str) -> list[str]:
    """The engine logs the gateway wrote on the state volume (<state_dir>/logs), oldest first."""
    mountpoint = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip())
    return [path.read_text(errors="replace") for path in sorted((mountpoint / "logs").glob("llamacpp-*.log"))]


def test_the_image_answers_stops_cleanly_and_restarts_from_its_volume(image: Built, volume: str) -> None:
    with Container(image.tag, volume) as first:
        first_ready_s = first.wait_ready()
        assert chat(first.url, "Say hello.").strip()
        assert f"serving {MODEL}" in first.logs()

        # a stream in flight when the container is stopped: the drain lets it finish
        lines: list[str] = []
        first_chunk = threading.Event()

        def stream() -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Count from 1 to 100."}],
                "max_tokens": 48,
                "ignore_eos": True,  # llama-server's own field: the stream lasts all 48 tokens
                "stream": True,
            }
            with httpx.stream("POST", first.url + "/v1/chat/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
                        first_chunk.set()

        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        assert first_chunk.wait(timeout=60), first.logs()
        stop_started = time.monotonic()
        podman("stop", "-t", "60", first.name, timeout=90)
        stop_s = time.monotonic() - stop_started
        streaming.join(timeout=30)
        state = first.state()
        logs = first.logs()
        assert state["ExitCode"] == 0, logs
        assert stop_s < GRACE_S + ENGINE_STOP_S + 3, f"podman stop took {stop_s:.1f} s:\n{logs}"
        assert "stopping: 1 requests in flight" in logs, logs
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert "ignored SIGTERM" not in logs  # the gateway stopped the engine; nothing was left to kill
    engine_log = engine_logs(volume)
    assert len(engine_log) == 1
    assert "cleaning up before exit" in engine_log[0], engine_log[0][-2000:]

    # the second container: the model and the configuration come from the volume; an unreachable
    # package index proves that nothing is downloaded
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "HF_HUB_OFFLINE": "1"}
    with Container(image.tag, volume, env=offline) as second:
        second_ready_s = second.wait_ready()
        assert chat(second.url, "Say hello.").strip()
        logs = second.logs()
        assert "using the configuration remembered on" in logs, logs
        stop_started = time.monotonic()
        podman("stop", "-t", "60", second.name, timeout=90)
        second_stop_s = time.monotonic() - stop_started
        assert second.state()["ExitCode"] == 0, second.logs()
    print(
        f"\nfirst start {first_ready_s:.1f} s (download included), stop with a stream in flight {stop_s:.1f} s; "
        f"second start {second_ready_s:.1f} s, stop {second_stop_s:.1f} s"
    )


def test_a_bad_model_exits_nonzero_with_its_one_line_error(image: Built, volume: str) -> None:
    done = podman(
        "run", "--rm", "-v", f"{volume}:/var/lib/gateway", image.tag, "--model", "no-such-model-anywhere", check=False
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("gateway: error:")]
    assert len(errors) == 1, done.stderr
    assert "no-such-model-anywhere" in errors[0] and "unexpected" not in errors[0], errors[0]
