"""llama.cpp through llama-cpp-python's OpenAI-compatible server: argv, health, log classifier.

The server runs as a child process (``python -m llama_cpp.server``); the gateway never imports
llama_cpp. Flag names are the server's pydantic settings (``--n_ctx``, ``--n_gpu_layers``...).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from backends.base import Failure, FailureKind, Launch
from gateway.errors import BackendError

ENGINE = "llamacpp"
DISTRIBUTION = "llama-cpp-python"
# /v1/models answers once the model is loaded (the server loads it before it binds the port).
HEALTH_PATH = "/v1/models"
# Without a planner (CPU), serve at most this much context: long prompts are slow on a CPU anyway.
CPU_CONTEXT_CAP = 32768
FALLBACK_CONTEXT = 4096  # when neither the catalog nor the GGUF header says


@dataclass(frozen=True)
class LlamaCppConfig:
    """What to run: the GGUF, the name to serve it under, and the engine settings."""

    gguf: Path
    served_name: str
    context_length: int
    chat_format: str | None = None
    gpu_layers: int = 0
    threads: int | None = None


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_command() -> list[str]:
    """This interpreter running the server module, after checking (without importing) that it exists."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendError(
            "llama-cpp-python is not installed in this environment: pip install 'gateway[llamacpp]' "
            "(or set llama_cpp_python_command to a Python that has it)"
        )
    return [sys.executable, "-m", "llama_cpp.server"]


def build_launch(config: LlamaCppConfig, *, port: int, api_key: str, command: list[str]) -> Launch:
    argv = [
        *command,
        "--model", str(config.gguf),
        "--model_alias", config.served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--api_key", api_key,
        "--n_ctx", str(config.context_length),
        "--n_gpu_layers", str(config.gpu_layers),
        # logits for every position would allocate n_ctx x vocab floats (32 GiB for Gemma at 32k)
        "--logits_all", "False",
    ]  # fmt: skip
    if config.threads:
        argv += ["--n_threads", str(config.threads)]
    if config.chat_format:
        argv += ["--chat_format", config.chat_format]
    version = installed_version()
    summary = (
        f"llama.cpp (llama-cpp-python {version or 'unknown version'}), {config.gguf.name}, "
        f"context {config.context_length}, {config.gpu_layers} GPU layers"
    )
    return Launch(
        engine=ENGINE,
        argv=argv,
        port=port,
        api_key=api_key,
        served_name=config.served_name,
        context_length=config.context_length,
        health_path=HEALTH_PATH,
        summary=summary,
    )


_PATTERNS: list[tuple[re.Pattern[str], FailureKind, str]] = [
    (
        re.compile(
            r"Model path does not exist|invalid magic characters|failed to read key-value pairs"
            r"|not within the file bounds|Failed to load model from file"
        ),
        FailureKind.MODEL_FILE,
        "the GGUF file is missing, truncated or not GGUF: re-download it",
    ),
    (
        re.compile(
            r"failed to allocate buffer|Failed to create llama_context|Unable to allocate|"
            r"cannot allocate|out of memory",
            re.IGNORECASE,
        ),
        FailureKind.OUT_OF_MEMORY,
        "not enough memory for this context: lower --context-length",
    ),
    (
        re.compile(r"address already in use"),
        FailureKind.PORT_IN_USE,
        "the backend's port was taken by another process: start again",
    ),
    (
        re.compile(r"error: argument|unrecognized arguments|Input should be"),
        FailureKind.BAD_ARGUMENT,
        "llama-cpp-python rejected an argument: check llama_cpp_python_command and its version",
    ),
]


def classify(line: str) -> Failure | None:
    """The failure this log line proves, if any."""
    for pattern, kind, fix in _PATTERNS:
        if pattern.search(line):
            return Failure(kind=kind, line=line.strip(), fix=fix)
    return None
