"""Reading llama.cpp's log (either launcher): failure lines and what each means for the user."""

from __future__ import annotations

import re

from backends.base import Failure, FailureKind, first_failure

_PATTERNS: list[tuple[re.Pattern[str], FailureKind, str]] = [
    (
        re.compile(
            r"Model path does not exist|invalid magic characters|failed to read key-value pairs"
            r"|not within the file bounds|Failed to load model from file|error loading model|failed to load model"
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
        re.compile(r"address already in use|couldn't bind HTTP server socket"),
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
    return first_failure(_PATTERNS, line)
