"""Network namespaces as "nodes" for tests: each a machine of its own network (veth pairs, addresses
only inside the namespaces made here), removed with every process in it when the test ends.

The test process itself stays outside; :class:`Inside` runs calls on a thread that entered one
namespace (``setns`` moves only the calling thread), so a client can reach a server that listens
on that namespace's addresses or loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"gwt-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", probe)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe)
    return None


class Namespaces:
    """The namespaces and links one test module made; :meth:`remove` undoes all of it."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: list[str] = []
        self._links = 0

    def add(self, name: str) -> str:
        full = f"{self.prefix}-{name}"
        self._check(_ip("netns", "add", full))
        self.names.append(full)
        self._check(_ip("-n", full, "link", "set", "lo", "up"))
        return full

    def link(self, left: str, left_address: str, right: str, right_address: str) -> None:
        """A veth pair between two namespaces, each end with its address (CIDR) and up."""
        self._links += 1
        a, b = f"gw{os.getpid() % 100000}l{self._links}a", f"gw{os.getpid() % 100000}l{self._links}b"
        self._check(_ip("link", "add", a, "netns", left, "type", "veth", "peer", "name", b, "netns", right))
        for ns, dev, address in ((left, a, left_address), (right, b, right_address)):
            self._check(_ip("-n", ns, "addr", "add", address, "dev", dev))
            self._check(_ip("-n", ns, "link", "set", dev, "up"))

    def unplug(self, name: str) -> None:
        """Take every link of the namespace down: its processes live on, but nothing reaches them and
        no reset comes back (a pulled cable, a machine without power)."""
        for line in _ip("-n", name, "-o", "link", "show").stdout.splitlines():
            device = line.split(":")[1].strip().split("@")[0]
            if device != "lo":
                self._check(_ip("-n", name, "link", "set", device, "down"))

    def pids(self, name: str) -> list[int]:
        done = _ip("netns", "pids", name)
        return [int(pid) for pid in done.stdout.split()]

    def freeze(self, name: str, keep: Collection[int] = ()) -> None:
        """SIGSTOP every process in the namespace but ``keep``: a machine that hangs (its sockets still take
        connections), or, keeping its worker, an engine that hangs on a machine that still answers."""
        for pid in self.pids(name):
            if pid in keep:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def kill_all(self, name: str) -> None:
        """SIGKILL every process in the namespace (what losing the machine looks like to the head)."""
        for _ in range(20):
            pids = self.pids(name)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def remove(self) -> None:
        for name in reversed(self.names):
            self.kill_all(name)
            _ip("netns", "delete", name)  # its veth ends go with it
        self.names.clear()

    @staticmethod
    def _check(done: subprocess.CompletedProcess[str]) -> None:
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(done.args[1:])}: {done.stderr.strip()}")


class Inside:
    """Runs calls on a thread that entered network namespace ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(max_workers=1, initializer=self._enter)

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(Path("/var/run/netns") / self.name, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.name} failed")
        finally:
            os.close(fd)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def take_down(
    nets: Namespaces,
    procs: Mapping[str, subprocess.Popen[Any]],
    inside: Inside | None,
    *,
    grace_s: float,
    times: dict[str, float] | None = None,
    what: str = "",
) -> None:
    """Ends a test's nodes: an orderly stop first (SIGTERM to each process: the head stops what it started
    there, each worker its own), up to ``grace_s`` each; with ``times``, what that stop left running in the
    namespaces is counted into it (``left_running``) and printed with the test's times under ``what``; then
    the namespaces are removed with whatever is left in them (SIGKILL), and every process reaped."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if times is not None:
        left = {name: nets.pids(name) for name in nets.names}
        times["left_running"] = float(sum(len(pids) for pids in left.values()))
        print(f"\n{what}, times (s): {times}; left running after the stop: {left}")
    nets.remove()
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if inside is not None:
        inside.close()
