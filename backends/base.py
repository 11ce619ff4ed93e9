"""What every backend hands the supervisor: a launch description and classified failures."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FailureKind(enum.Enum):
    MODEL_FILE = "model file missing or corrupt"
    OUT_OF_MEMORY = "out of memory"
    PORT_IN_USE = "port in use"
    BAD_ARGUMENT = "bad argument"


@dataclass(frozen=True)
class Failure:
    """A failure recognised in an engine's log line, with the line that proved it."""

    kind: FailureKind
    line: str
    fix: str
