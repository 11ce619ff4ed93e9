"""What every backend hands the supervisor: a launch description and classified failures."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Launch:
    """A fully decided engine start: the supervisor runs ``argv`` with ``env`` added and polls health."""

    engine: str  # "llamacpp" | "vllm"
    argv: list[str]
    port: int
    api_key: str
    served_name: str  # the model name the engine answers to
    context_length: int
    health_path: str
    summary: str  # one line for the console: what is being started and with what
    env: dict[str, str] = field(default_factory=dict)
    max_concurrency: int = 1  # requests the engine runs at once (vLLM max_num_seqs, llama.cpp slots)
    # what the engine does itself, so the gateway does not redo it: "responses", "messages",
    # "include_usage", "max_completion_tokens"
    native: frozenset[str] = frozenset()
    reasoning_field: str | None = None  # the one of reasoning / reasoning_content the engine emits
    tokenize_path: str | None = None  # counts tokens: POST {tokenize_key: text} → {"count": n}
    tokenize_key: str = "input"
    base: str | None = None  # a server somewhere else (--backend-url); launched engines are on loopback

    @property
    def base_url(self) -> str:
        return self.base or f"http://127.0.0.1:{self.port}"


class FailureKind(enum.Enum):
    """Why an engine did not come up. Memory kinds are stepped down from; the others are not."""

    WEIGHTS_OOM = "out of memory while loading weights"
    KV_TOO_SMALL = "KV cache smaller than one max-length request"
    NO_KV_MEMORY = "no memory left for the KV cache"
    FREE_BELOW_UTILIZATION = "free memory below the requested utilization"
    KV_EXCEEDS_FREE = "requested KV cache larger than free memory"
    OUT_OF_MEMORY = "out of memory"
    MAX_LEN_OVER_LIMIT = "max model length above the model's limit"
    BAD_ARGUMENT = "bad argument"
    MODEL_FILE = "model file missing or corrupt"
    PORT_IN_USE = "port in use"
    ENGINE_FAILED = "engine failed to start"

    @property
    def is_memory(self) -> bool:
        return self in _MEMORY

    @property
    def is_configuration(self) -> bool:
        """Retrying cannot help: the user must change something (the fix says what)."""
        return self in (FailureKind.MAX_LEN_OVER_LIMIT, FailureKind.BAD_ARGUMENT, FailureKind.MODEL_FILE)


_MEMORY = {
    FailureKind.WEIGHTS_OOM,
    FailureKind.KV_TOO_SMALL,
    FailureKind.NO_KV_MEMORY,
    FailureKind.FREE_BELOW_UTILIZATION,
    FailureKind.KV_EXCEEDS_FREE,
    FailureKind.OUT_OF_MEMORY,
}


@dataclass(frozen=True)
class Failure:
    """A failure recognised in an engine's log line, with the numbers the engine printed."""

    kind: FailureKind
    line: str
    fix: str
    numbers: dict[str, float] = field(default_factory=dict)


# (pattern, kind, fix): the pattern's groups are the numbers the engine printed, in the order named
FailurePatterns = Sequence[tuple[re.Pattern[str], FailureKind, str]]


def first_failure(
    patterns: FailurePatterns, line: str, number_names: Mapping[FailureKind, tuple[str, ...]] | None = None
) -> Failure | None:
    """The failure the first matching pattern proves, with its captured numbers named."""
    for pattern, kind, fix in patterns:
        if match := pattern.search(line):
            values = [float(group.replace(",", "")) for group in match.groups()]
            names = (number_names or {}).get(kind, ())
            return Failure(kind=kind, line=line.strip(), fix=fix, numbers=dict(zip(names, values, strict=False)))
    return None


class Option(Protocol):
    """One startable configuration of one engine: what the supervisor starts, retries and remembers.

    Each backend's option knows how to launch itself, read its engine's log lines, and step down on
    the engine's own numbers; the supervisor only orders them.
    """

    @property
    def engine(self) -> str: ...
    @property
    def label(self) -> str: ...  # one line for logs and /status
    @property
    def weights_key(self) -> tuple[object, ...]: ...  # equal keys load the same weights per device
    @property
    def context_length(self) -> int: ...
    def launch(self, port: int, api_key: str) -> Launch: ...
    def classify(self, line: str) -> Failure | None: ...
    def after(self, failure: Failure) -> Option | None: ...  # the same option adjusted to the engine's numbers
    def memo(self) -> dict[str, Any]: ...  # what to remember when it worked
    def prepare(self) -> Option: ...  # blocking work before a start (e.g. fetching a file)
    def from_memo(self, memo: dict[str, Any]) -> Option: ...
