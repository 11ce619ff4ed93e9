"""vLLM's own settings: where vLLM is, which release to plan for, and the engine flags a user may pin.

Declared here, composed into the gateway's settings through the registry (``Backend.settings_model``);
the pinned ones (``PINS``) reach the ladder through the policy as :class:`VllmPins`: a pinned value is
evaluated exactly and never varied on the ladder.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pydantic import BaseModel, Field, field_validator

from gateway.core.policy import Policy
from gateway.core.settings import parse_count


class VllmSettings(BaseModel):
    vllm_command: list[str] | None = Field(
        None,
        description="argv prefix that starts vLLM's OpenAI server (`[vllm, serve]` or "
        "`[python, -m, vllm.entrypoints.openai.api_server]`); unset: vLLM beside the gateway, if any.",
        json_schema_extra={"parse": "shlex"},
    )
    vllm_version: str | None = Field(None, description="vLLM version to plan for; unset: read from vllm_command.")
    allow_cpu_offload: bool = Field(False, description="vLLM: let the ladder use --cpu-offload-gb (slow).")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM: pin this share.")
    kv_cache_memory_bytes: int | None = Field(
        None, gt=0, description="vLLM: pin the KV cache size in bytes.", json_schema_extra={"parse": "count"}
    )
    max_num_seqs: int | None = Field(None, ge=1, description="vLLM: pin the number of sequences.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="vLLM: pin the tokens per batch.")
    tensor_parallel_size: int | None = Field(None, ge=1, description="vLLM: pin the TP size.")
    pipeline_parallel_size: int | None = Field(
        None,
        ge=1,
        description="vLLM: pin the pipeline stages, one per node (this machine, then the workers that run vLLM, "
        "in --workers order); with fewer such nodes answering, planned on one node.",
    )
    enforce_eager: bool | None = Field(None, description="vLLM: pin eager mode on.")
    kv_cache_dtype: str | None = Field(
        None,
        pattern="^(auto|fp8)$",
        description="vLLM: pin the KV cache dtype.",
        json_schema_extra={"choices": ["auto", "fp8"]},
    )
    cpu_offload_gb: float | None = Field(None, ge=0, description="vLLM: pin --cpu-offload-gb.")

    @field_validator("kv_cache_memory_bytes", mode="before")
    @classmethod
    def _byte_forms(cls, value: Any) -> Any:
        return parse_count(value) if isinstance(value, str) else value


# the settings that pin a vLLM flag (allow_cpu_offload widens the ladder instead; it travels with them)
PINS = (
    "tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
    "kv_cache_memory_bytes", "enforce_eager", "cpu_offload_gb", "allow_cpu_offload", "pipeline_parallel_size",
)  # fmt: skip


@dataclass(frozen=True)
class VllmPins:
    """The flags the user pinned, as vLLM's ladder reads them (None: the ladder chooses)."""

    context_length: int | None = None  # --max-model-len
    context_auto: bool | None = None  # --max-model-len auto / -1
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool | None = None
    cpu_offload_gb: float | None = None
    allow_cpu_offload: bool = False
    pipeline_parallel_size: int | None = None

    def __bool__(self) -> bool:
        """Any flag pinned (allow_cpu_offload widens the ladder; it pins nothing)."""
        return any(getattr(self, f.name) is not None for f in fields(self) if f.name != "allow_cpu_offload")

    @classmethod
    def from_policy(cls, policy: Policy) -> VllmPins:
        """vLLM's pins among the policy's: the shared context and the flags vLLM declares (``PINS``)."""
        engine = {name: value for name, value in policy.pins.engine.items() if name in PINS and value is not None}
        return cls(context_length=policy.pins.context_length, context_auto=policy.pins.context_auto, **engine)
