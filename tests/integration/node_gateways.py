"""The gateway processes of a test's network-namespace nodes (tests/integration/netns.py): a head that serves
and workers, each started as ``gateway …`` inside its namespace and logging to ``workdir/<name>.log``, and the
head's HTTP API called from inside the head's namespace. Shared by the multi-node test modules (llama.cpp's
RPC pool, vLLM's group over two nodes, replicas on two nodes), each adding its own scenario's calls."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.integration.netns import Inside, Namespaces
from tests.waiting import exited, wait_until

HEAD_PORT = 18000


@dataclass
class NodeGateways:
    nets: Namespaces
    inside: Inside  # a thread in the head's namespace
    workdir: Path
    env: dict[str, str] = field(default_factory=dict, kw_only=True)  # added to every process's environment
    nice: bool = field(default=False, kw_only=True)  # every process at the lowest CPU priority (the test's own)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, kw_only=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{HEAD_PORT}"

    def start(self, name: str, ns: str, *args: str) -> None:
        """``gateway *args`` in namespace ``ns`` as ``name``; one of that name started before (a node killed
        and started again) is reaped first."""
        if (old := self.procs.get(name)) is not None:
            old.kill()
            old.wait()
        argv = [
            "ip",
            "netns",
            "exec",
            ns,
            *(["nice", "-n", "19"] if self.nice else []),
            sys.executable,
            "-m",
            "gateway",
        ]
        with (self.workdir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [*argv, *args], stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env={**os.environ, **self.env}
            )

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.inside.call(httpx.get, self.url + path, timeout=30, **kwargs)

    def status(self) -> dict[str, Any]:
        return dict(self.get("/status").json())

    def status_when(
        self, holds: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 120, interval_s: float = 0.5
    ) -> dict[str, Any]:
        """The first /status for which ``holds`` is true (one that does not answer is asked again); fails with
        the head's log, at once if the head exits."""

        def matching() -> dict[str, Any] | None:
            with contextlib.suppress(httpx.HTTPError):
                status = self.status()
                return status if holds(status) else None
            return None

        try:
            found = wait_until(
                matching, what=what, timeout_s=timeout_s, interval_s=interval_s, abort=exited(self.procs["head"])
            )
        except AssertionError as failed:
            log = self.log("head")
            # the head's warnings and errors first (a node's missed lease renewals scroll out of the tail)
            said = "\n".join([line for line in log.splitlines() if " WARNING " in line or " ERROR " in line][-40:])
            raise AssertionError(f"{failed}:\n{said}\n...\n{log[-6000:]}") from None
        assert found is not None
        return found
