"""``agent_load.py --nodes``: the gateway's replicas on two network-namespace nodes, one replica each, as the
multi-node tests make them (tests/integration/netns.py; root needed): the head node runs ``gateway serve``
and its own replica, the second node runs ``gateway worker``, which runs the other replica for the head
(docs/replicas.md, "A replica on another node"). One replica: the head node alone. Losing a node: every
process in the second node's namespace SIGKILLed (the worker and its engine), then the worker started
again after ``down_s``.

The benchmark's own threads stay in the machine's namespace; each call to the head runs on a thread
that entered the head node's (:func:`run_in`; a session's thread enters it for good: :func:`enter`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.integration.netns import Namespaces

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
KEY = "agent-load-worker-key"
WORKER_PORT = 50100
NODE_NAME = "node-b"


def enter(netns: str) -> None:
    """Move the calling thread (only it: setns) into network namespace ``netns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(Path("/var/run/netns") / netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
    finally:
        os.close(fd)


def run_in(netns: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread inside ``netns`` (here when None); its result or its exception."""
    if netns is None:
        return fn(*args, **kwargs)
    out: queue.Queue[tuple[bool, Any]] = queue.Queue()

    def call() -> None:
        try:
            enter(netns)
            out.put((True, fn(*args, **kwargs)))
        except BaseException as exc:  # handed to the caller
            out.put((False, exc))

    threading.Thread(target=call, daemon=True).start()
    ok, value = out.get()
    if not ok:
        raise value
    result: T = value
    return result


@dataclass
class TwoNodes:
    """The namespaces, the head's and the worker's processes, and how to lose and restore the worker's node."""

    nets: Namespaces
    head: str
    node: str
    node_address: str
    workdir: Path
    worker_args: list[str]
    down_s: float
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, netns: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, *argv], stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.procs[name] = proc
        return proc

    def start_worker(self) -> None:
        if (old := self.procs.get("worker")) is not None:
            with contextlib.suppress(ProcessLookupError):
                old.kill()
            old.wait()
        argv = [
            sys.executable, "-m", "gateway", "worker", "--host", self.node_address, "--port", str(WORKER_PORT),
            "--name", NODE_NAME, "--api-key", KEY, "--state-dir", str(self.workdir / "state-b"),
            "--log-dir", str(self.workdir / "logs-b"), *self.worker_args,
        ]  # fmt: skip
        self.start("worker", self.node, argv)
        url = f"http://{self.node_address}:{WORKER_PORT}/health"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if run_in(self.head, httpx.get, url, timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the worker did not answer: {(self.workdir / 'worker.log').read_text()[-2000:]}")

    def lose_node(self) -> None:
        """The second node gone (every process in it SIGKILLed), then back after ``down_s`` (its worker again)."""
        self.nets.kill_all(self.node)
        time.sleep(self.down_s)
        self.start_worker()


@contextlib.contextmanager
def two_nodes(workdir: Path, worker_args: list[str], *, with_worker: bool, down_s: float) -> Iterator[TwoNodes]:
    """The head node and the second one linked (the second's worker started when ``with_worker``); every
    process in them killed and the namespaces removed at the end."""
    nets = Namespaces(f"gwl{os.getpid() % 100000}")
    nodes: TwoNodes | None = None
    try:
        head, node = nets.add("head"), nets.add("b")
        nets.link(head, "10.233.71.1/24", node, "10.233.71.2/24")
        nodes = TwoNodes(nets, head, node, "10.233.71.2", workdir, worker_args, down_s)
        if with_worker:
            nodes.start_worker()
        yield nodes
    finally:
        for proc in nodes.procs.values() if nodes is not None else ():
            if proc.poll() is None:
                proc.terminate()
        for proc in nodes.procs.values() if nodes is not None else ():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        nets.remove()
        for proc in nodes.procs.values() if nodes is not None else ():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def serve_args() -> list[str]:
    """The head's flags for the worker's replica."""
    return ["--workers", f"10.233.71.2:{WORKER_PORT}", "--worker-api-key", KEY]
