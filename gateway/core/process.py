"""A child process in its own process group, its output captured line by line, stopped as a group.

Engines spawn helpers (vLLM starts several processes), so every signal goes to the whole group:
SIGTERM, a grace period, then SIGKILL, then reap. On Linux the child also gets PDEATHSIG so that a
gateway killed with SIGKILL does not leave an engine holding GPU memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gateway.core.reaper import PARENT_DIED, PARENT_PID_VARIABLE, set_parent_death_signal

log = logging.getLogger("gateway.process")


# What of the gateway's own environment an engine (or a worker's device server) gets: where programs
# and libraries are, the user, locale and temp dirs, certificates and proxies for hub downloads, and the
# engines' and their libraries' own variables. Not the rest: the gateway's settings (GATEWAY_*, its API
# keys among them) and whatever else the shell carried are none of the engine's business, and a
# variable an engine reads by surprise must not change what the plan decided. Each engine names its
# own families (Launch.inherit, DeviceLender.inherit) and adds its own variables (its key...) on top.
CHILD_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TMP", "TEMP",
        "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CC", "CXX", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    }
)  # fmt: skip
CHILD_ENV_PREFIXES = (
    "LC_", "XDG_", "PYTHON", "CUDA_", "NVIDIA_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_",
    "TRITON_", "NCCL_", "GLOO_", "RAY_", "OMP_", "MKL_", "KMP_", "OPENBLAS_",
)  # fmt: skip


def child_environment(
    extra: dict[str, str], parent: dict[str, str] | None = None, inherit: tuple[str, ...] = ()
) -> dict[str, str]:
    """The explicit environment a child starts with: the listed part of ``parent`` (the gateway's own
    environment) and the families the child's engine names in ``inherit``, then ``extra``."""
    source = dict(os.environ) if parent is None else parent
    prefixes = CHILD_ENV_PREFIXES + inherit
    kept = {k: v for k, v in source.items() if k in CHILD_ENV_NAMES or k.startswith(prefixes)}
    return kept | extra


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reaper_learns_of_our_death() -> None:  # runs in the child between fork and exec
    set_parent_death_signal(PARENT_DIED)


def _runnable(command: str) -> None:
    """Raise FileNotFoundError/PermissionError now, as exec would, rather than from inside the reaper."""
    path = shutil.which(command)
    if path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


class LogNotWritable(OSError):
    """The engine's log file cannot be created: the process is not started (nothing to clean up)."""


class ChildProcess:
    """One running child: its output goes to ``log_path`` and a tail kept in memory."""

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
        inherit: tuple[str, ...] = (),
        tail_lines: int = 200,
    ) -> None:
        self.argv = argv
        self.log_path = log_path
        self.env = env or {}
        self.inherit = inherit  # the engine's own variable families it keeps (Launch.inherit)
        self.on_line = on_line
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.returncode: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._sink: TextIO | None = None
        self.dropped_lines = 0  # lines not written to the log (its disk full or gone); still read

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        """Start ``argv`` under :mod:`gateway.core.reaper`, which leads the new process group and kills all
        of it with SIGKILL should the gateway die (a busy engine ignores anything gentler)."""
        _runnable(self.argv[0])
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._sink = self.log_path.open("a", encoding="utf-8")
        except OSError as exc:
            raise LogNotWritable(
                exc.errno, f"cannot write the log {self.log_path} ({exc.strerror}): set log_dir or state_dir to a "
                "writable directory",
            ) from exc  # fmt: skip
        try:
            self._proc = await self._spawn()
        except BaseException:
            self._sink.close()
            raise
        self._pump = asyncio.create_task(self._pump_output(), name=f"output of pid {self._proc.pid}")

    async def _spawn(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.core.reaper",
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=child_environment(self.env, inherit=self.inherit) | {PARENT_PID_VARIABLE: str(os.getpid())},
            start_new_session=True,
            preexec_fn=_reaper_learns_of_our_death,
            limit=1 << 20,  # engines print long lines (llama.cpp's model metadata dict)
        )

    async def _pump_output(self) -> None:
        assert self._proc and self._proc.stdout and self._sink
        try:
            await self._copy_lines(self._proc.stdout, self._sink)
        finally:
            with contextlib.suppress(OSError):  # closing flushes: on a full disk that fails too
                self._sink.close()

    async def _copy_lines(self, stream: asyncio.StreamReader, sink: TextIO) -> None:
        """Every line is read, whatever happens to the log file: a child whose output nobody reads
        blocks on its next write once the pipe is full (an engine froze that way on a full disk)."""
        writable = True
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the reader's limit: take what is buffered
                raw = await stream.read(64 * 1024)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if writable:
                try:
                    sink.write(line + "\n")
                    sink.flush()
                except OSError as exc:
                    writable = False
                    log.error(
                        "cannot write %s (%s): its further lines are dropped (the last ones stay in /status)",
                        self.log_path, exc.strerror or exc,
                    )  # fmt: skip
            if not writable:
                self.dropped_lines += 1
            self.tail.append(line)
            if self.on_line:
                self.on_line(line)

    async def wait(self) -> int:
        """Wait for exit and for the output to be fully read; return the exit status."""
        assert self._proc
        code = await self._proc.wait()
        if self._pump:
            with contextlib.suppress(asyncio.TimeoutError):
                # a grandchild may still hold the pipe open: do not wait on it forever
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=2)
        self.returncode = code
        return code

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait ``grace_s``, SIGKILL the group, reap. Safe to call twice."""
        if self._proc is None:
            return None
        if self._proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)  # a stopped process (SIGSTOP) handles its SIGTERM only once continued
            try:
                await asyncio.wait_for(self._proc.wait(), timeout=grace_s)
            except TimeoutError:
                log.warning("backend pid %s ignored SIGTERM for %.0f s: killing its group", self.pid, grace_s)
        # the leader may be gone while helpers in its group live on: kill the group regardless
        self._signal_group(signal.SIGKILL)
        code = await self.wait()
        if self._pump and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        return code
