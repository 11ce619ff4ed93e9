"""What the user asked of a plan, typed once and handed to every engine.

``Pins`` are flags given explicitly (CLI, environment or gateway.toml): an engine evaluates exactly
those values and never varies them on its ladder. ``Policy`` adds the context bounds and which
engines may be planned. One object from the settings to every backend, for `plan` and `serve` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gateway.errors import ConfigError
from gateway.settings import AUTO as AUTO_CONTEXT  # context_length auto / -1

DEFAULT_MIN_CONTEXT = 32768
# Without a GPU, serve at most this much context: long prompts are slow on a CPU anyway.
CPU_CONTEXT_CAP = 32768
FALLBACK_CONTEXT = 4096  # when neither the catalog nor the model's files say


@dataclass(frozen=True)
class Pins:
    """Engine flags the user gave; None: the engine's ladder chooses."""

    context_length: int | None = None  # vLLM --max-model-len, llama.cpp -c
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool | None = None
    cpu_offload_gb: float | None = None
    context_auto: bool | None = None  # --max-model-len auto / -1: the longest that fits, as vLLM fits it

    @classmethod
    def from_values(cls, values: Any) -> Pins:
        """The pins among ``values``' attributes (a Settings object); a context length of -1 (auto)
        pins no length: every engine sizes the longest that fits."""
        pins = {f.name: getattr(values, f.name, None) for f in fields(cls)}
        if pins["context_length"] == AUTO_CONTEXT:
            pins["context_length"], pins["context_auto"] = None, True
        return cls(**pins)

    def given(self) -> dict[str, Any]:
        """Only the pinned flags, by name (for warnings and JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __bool__(self) -> bool:
        return bool(self.given())


@dataclass(frozen=True)
class Policy:
    min_context: int = DEFAULT_MIN_CONTEXT
    max_context: int | None = None  # longest context worth reserving; None: the model's own limit
    allow_cpu_offload: bool = False
    engines: tuple[str, ...] | None = None  # plan only these engines; None: every registered one
    pins: Pins = field(default_factory=Pins)
    # the configuration remembered on this machine (known-good.json) with the engine's own measured
    # speed: a backend may calibrate its estimates on it (llama.cpp's host bandwidth term)
    remembered: dict[str, Any] | None = None
    quant: str | None = None  # a hub model's GGUF quantization (or file) the user chose

    def plans(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines


def policy_for(settings: Any, limit: int | None, has_gpus: bool) -> Policy:
    """The policy `plan` and `serve` both use, from the settings and the model's own context limit.

    A pinned context length is the minimum too, unless ``min_context`` was given explicitly; without
    a pin the longest context is the model's limit, capped on a CPU (nothing to gain from 128k there).
    """
    pins = Pins.from_values(settings)
    explicit_min = "min_context" in settings.model_fields_set
    engines = (settings.engine,) if settings.engine else None
    common = {
        "allow_cpu_offload": settings.allow_cpu_offload,
        "engines": engines,
        "pins": pins,
        "quant": getattr(settings, "quant", None),
    }
    if pins.context_length is not None:
        if limit is not None and pins.context_length > limit:
            raise ConfigError(
                f"context_length {pins.context_length} exceeds the model's maximum of {limit}: "
                f"pass --context-length {limit} or less"
            )
        minimum = settings.min_context if explicit_min else pins.context_length
        return Policy(min_context=minimum, max_context=settings.max_context, **common)
    top = settings.max_context or limit or FALLBACK_CONTEXT
    cap = top if has_gpus else min(top, CPU_CONTEXT_CAP)
    minimum = settings.min_context if explicit_min else min(settings.min_context, cap)
    return Policy(min_context=minimum, max_context=cap, **common)
