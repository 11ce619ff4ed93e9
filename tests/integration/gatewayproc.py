"""Runs ``gateway serve`` as a real subprocess for tests, logging to a file (a pipe could block it)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.waiting import exited, wait_until


def engine_threads() -> int:
    """Threads for one engine: the machine's cores shared among the suite's workers (scripts/test runs two,
    and each may run an engine at the same time). Two llama-servers of two threads each on two cores ran
    many times slower than one thread each: ggml's threads busy-wait at every barrier for a thread that the
    other engine holds off its core (a 2,300-token answer took over 10 minutes instead of 80 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.log_path = workdir / f"gateway-{self.port}.log"
        self.argv = [
            sys.executable, "-m", "gateway", "serve",
            "--port", str(self.port), "--state-dir", str(workdir / "state"), "--threads", str(engine_threads()), *args,
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_statuses: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        with self.log_path.open("wb") as sink:
            self.proc = subprocess.Popen(
                self.argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 180) -> None:
        self.wait_ready_with(timeout_s=timeout_s)

    def wait_ready_with(self, timeout_s: float = 180, headers: dict[str, str] | None = None) -> None:
        """Poll /ready, recording every status seen, until 200; fail with the log if it never comes."""
        assert self.proc

        def ready() -> bool:
            try:
                status = httpx.get(self.url + "/ready", timeout=5, headers=headers).status_code
            except httpx.TransportError:
                return False
            self.ready_statuses.append(status)
            return status == 200

        try:
            wait_until(ready, what="the gateway's /ready", timeout_s=timeout_s, interval_s=0.1, abort=exited(self.proc))
        except AssertionError as failed:
            raise AssertionError(f"{failed}:\n{self.log()}") from None

    @contextlib.contextmanager
    def serving(self, headers: dict[str, str] | None = None) -> Iterator[GatewayProcess]:
        """Started and ready for the block; afterwards stopped with SIGTERM and everything it started
        killed, also when the block fails."""
        self.start()
        try:
            self.wait_ready_with(headers=headers)
            yield self
        finally:
            self.stop()
            self.kill()

    def status(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/status", timeout=5).json())

    def backend_pid(self) -> int:
        return int(self.status()["backend"]["pid"])

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30) -> int:
        assert self.proc
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"gateway ignored {sig.name} for {timeout_s} s:\n{self.log()}") from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        """Last-resort cleanup: the gateway and every descendant."""
        if self.proc is None:
            return
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for process in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def port_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
