"""Reading llama.cpp's log (either launcher): failure lines and what each means for the user."""

from __future__ import annotations

import re

from gateway.backends.base import Failure, FailureKind, first_failure

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
        # at start (the device is down), or while serving (it died; llama-server aborts on its next use)
        re.compile(
            r"ggml-rpc\.cpp:\d+: Failed to connect to \S+|Failed to connect to RPC server"
            r"|Remote RPC server crashed or returned malformed response"
        ),
        FailureKind.DEVICE_UNREACHABLE,
        "an RPC device (ggml-rpc-server) does not answer: start it again, or plan without it",
    ),
    (
        re.compile(r"error: argument|unrecognized arguments|Input should be|error: invalid argument"),
        FailureKind.BAD_ARGUMENT,
        "llama-cpp-python rejected an argument: check llama_cpp_python_command and its version",
    ),
]


def classify(line: str) -> Failure | None:
    """The failure this log line proves, if any."""
    return first_failure(_PATTERNS, line)


# "load_tensors: RPC0[127.0.0.1:50062] model buffer size =   216.87 MiB" (llama-server at -lv 4, and
# llama-cpp-python's verbose log): which device holds how much of each term
_BUFFER = re.compile(
    r"\b(?:load_tensors|llama_kv_cache|llama_context|sched_reserve|llama_kv_cache_unified|llama_new_context_with_model)"
    r":\s+(?P<device>[A-Za-z_]+\d*)(?:\[(?P<endpoint>[^\]]+)\])?\s+(?P<term>model|KV|compute|output)"
    r" buffer size =\s+(?P<mib>[0-9.]+) MiB"
)
_TERMS = {"model": "model", "KV": "kv_cache", "compute": "compute", "output": "output"}


def memory_line(line: str) -> tuple[str, str, int] | None:
    """(device, term, bytes) from one buffer line; an RPC device is named by its endpoint (llama.cpp
    prints every RPC device as RPC0), mapped model files on the host as CPU."""
    match = _BUFFER.search(line)
    if match is None:
        return None
    device = match["device"]
    if match["endpoint"]:
        device = f"RPC[{match['endpoint']}]"
    elif device.startswith("CPU"):
        device = "CPU"
    return device, _TERMS[match["term"]], int(float(match["mib"]) * 1024 * 1024)


# The engine's own timings after each request. llama-server (tools/server, print_timings):
#   prompt eval time =      35.28 ms /     9 tokens (    3.92 ms per token,   255.10 tokens per second)
#          eval time =     512.14 ms /    31 tokens (   16.52 ms per token,    60.53 tokens per second)
# llama-cpp-python (llama_perf_context_print): the same with "runs" for the generated tokens.
_TIMING = re.compile(
    r"(?P<prompt>prompt )?eval time =\s*(?P<ms>[0-9.]+) ms /\s*(?P<n>\d+) (?:tokens|runs)"
    r"\s*\(\s*[0-9.]+ ms per token,\s*[0-9.]+ tokens per second\)"
)


# llama-server with speculative decoding, after each request (tools/server, print_timing):
#   draft acceptance = 0.27778 (   10 accepted /    36 generated), mean len = 11.00
_DRAFTS = re.compile(r"draft acceptance = [0-9.]+ \(\s*(?P<accepted>\d+) accepted /\s*(?P<drafted>\d+) generated\)")


def speed_line(line: str) -> tuple[str, int, float] | None:
    """("prompt" | "decode", tokens, seconds) from one timings line, ("draft", accepted, drafted)
    from a draft acceptance line, or None."""
    if drafts := _DRAFTS.search(line):
        return "draft", int(drafts["accepted"]), float(drafts["drafted"])
    match = _TIMING.search(line)
    if match is None or int(match["n"]) == 0:
        return None
    return ("prompt" if match["prompt"] else "decode"), int(match["n"]), float(match["ms"]) / 1000
