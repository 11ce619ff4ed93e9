"""Runs one engine so that it cannot outlive the gateway, busy or not: ``python -m gateway.core.reaper ARGV``.

Engines catch SIGTERM and finish the generation in flight first (llama-cpp-python's uvicorn waits
without bound), and a parent-death signal reaches only the gateway's direct child, not what that
child started. So the gateway starts this small process as the leader of the engine's process group;
the kernel sends it SIGUSR1 when the gateway dies (``PR_SET_PDEATHSIG``, set before exec), and it
answers with SIGKILL to the whole group, itself included. The engine itself also dies by SIGKILL
if this process is killed. Everything else is relayed untouched: output is inherited, SIGTERM from
the gateway's orderly stop reaches the engine through the group, and the exit status is the
engine's (a death by signal is re-raised on this process).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
PARENT_DIED = signal.SIGUSR1  # what the gateway's death sends to this process
# the gateway's pid, set by the gateway: "my parent is now PID 1" cannot tell that the gateway died
# where the gateway itself is PID 1 (the entry point of a container)
PARENT_PID_VARIABLE = "GATEWAY_REAPER_PARENT"


def set_parent_death_signal(sig: signal.Signals) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (kept across exec)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _kill_group(_signum: int, _frame: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


_stop_signals: list[int] = []  # the orderly stops that reached this process (each handled by _keep_waiting)


def _keep_waiting(signum: int, _frame: object) -> None:
    """The signal reached the engine through the group too; wait for it to exit. It is noted: one that came
    before the engine existed reached nothing else, and is passed on once the engine is started."""
    _stop_signals.append(signum)


def parent_died() -> bool:
    """Whether the gateway died before the kernel could be told to signal its death: this process was
    re-parented (to PID 1, or to a subreaper). The variable is not passed on to the engine."""
    expected = os.environ.pop(PARENT_PID_VARIABLE, None)
    return os.getppid() != int(expected) if expected else os.getppid() == 1


def main(argv: list[str]) -> int:
    signal.signal(PARENT_DIED, _kill_group)
    if parent_died():
        return 1
    for relayed in (signal.SIGTERM, signal.SIGINT):  # the orderly stop is the engine's to answer; a handler,
        signal.signal(relayed, _keep_waiting)  # not SIG_IGN, so that the engine does not inherit "ignored"
    try:
        engine = subprocess.Popen(
            argv,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL),
            restore_signals=True,
        )
    except OSError as exc:
        print(f"cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    if _stop_signals:  # a stop sent while the engine was being started: it never saw it (a 10-s stop grace
        engine.send_signal(_stop_signals[0])  # waited out, then SIGKILL), so it gets it now
    code = engine.wait()
    if code < 0:  # died by a signal: die by the same one, so the gateway sees what the engine got
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
