"""A llama.cpp placement the supervisor can start, retry once with a smaller KV cache, and remember."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.backends.base import Failure, FailureKind, Launch
from gateway.backends.llamacpp.argv import ENGINE, LlamaCppConfig, build_launch, split_phrase
from gateway.backends.llamacpp.drafting import ARGV as DRAFT_ARGV
from gateway.backends.llamacpp.kv_cache import KV_TYPES
from gateway.backends.llamacpp.logs import classify


@dataclass(frozen=True)
class LlamaCppOption:
    """A llama.cpp placement the supervisor can start and remember."""

    config: LlamaCppConfig
    command: tuple[str, ...]
    fetch: Callable[[], Path] | None = None  # downloads the GGUF when it is not local yet
    variant: dict[str, Any] | None = None  # the hub quantization it loads (repo, files, size, quant)
    engine: str = ENGINE
    estimated_tokens_per_s: float = 0.0  # the plan's decode estimate, shown beside the measured speed

    def prepare(self) -> LlamaCppOption:
        if self.fetch is None:
            return self
        return replace(self, config=replace(self.config, gguf=self.fetch()), fetch=None)

    @property
    def label(self) -> str:
        c = self.config
        split = split_phrase(c.tensor_split, c.rpc)
        draft = f", drafting {c.draft}" if c.draft else ""
        return (
            f"llama.cpp ({c.launcher.server}) {c.gguf.name}, context {c.context_length}, KV {c.kv_type}, "
            f"{c.gpu_layers} GPU layers{split}{draft}"
        )

    @property
    def context_length(self) -> int:
        return self.config.context_length

    @property
    def weights_key(self) -> tuple[object, ...]:
        return (str(self.config.gguf), self.config.gpu_layers, self.config.tensor_split, self.config.rpc)

    def launch(self, port: int, api_key: str) -> Launch:
        return build_launch(self.config, port=port, api_key=api_key, command=list(self.command))

    def classify(self, line: str) -> Failure | None:
        return classify(line)

    def step_down(self, failure: Failure) -> LlamaCppOption | None:
        """Drafting is an extra: whatever stopped a drafting engine (its MTP weights, cache and
        context, a GGUF without the nextn block), the same placement is tried without it first.
        Out of memory: a q8_0 KV cache needs about half the memory of f16; try that once."""
        if self.config.draft and failure.kind not in (FailureKind.PORT_IN_USE, FailureKind.DEVICE_UNREACHABLE):
            return replace(self, config=replace(self.config, draft=None))
        if failure.kind is FailureKind.OUT_OF_MEMORY and self.config.kv_type == "f16":
            return replace(self, config=replace(self.config, kv_type="q8_0"))
        return None

    def memo(self) -> dict[str, Any]:
        c = self.config
        return {
            "gguf": str(c.gguf),
            "context_length": c.context_length,
            "gpu_layers": c.gpu_layers,
            "tensor_split": list(c.tensor_split),
            "kv_type": c.kv_type,
            "draft": c.draft,
        } | ({"hub_variant": self.variant} if self.variant else {})

    def from_memo(self, memo: dict[str, Any]) -> LlamaCppOption:
        remembered = memo.get("hub_variant")
        if self.variant and remembered and remembered.get("files") != self.variant.get("files"):
            raise ValueError("remembered for another quantization than the one planned (e.g. --quant)")
        config = replace(
            self.config,
            gguf=Path(memo["gguf"]),
            context_length=int(memo["context_length"]),
            gpu_layers=int(memo["gpu_layers"]),
            tensor_split=_shares(memo["tensor_split"]),
            kv_type=_kv_type(memo["kv_type"]),
            # what worked, where the plan still drafts (not after --llama-draft off)
            draft=_draft(memo.get("draft")) if self.config.draft else None,
        )
        return replace(self, config=config, variant=memo.get("hub_variant", self.variant))


def _shares(value: object) -> tuple[float, ...]:
    """A remembered split: one number per device, checked as it is read rather than at the launch."""
    if not isinstance(value, list) or not all(isinstance(s, int | float) and not isinstance(s, bool) for s in value):
        raise ValueError(f"tensor_split is not a list of numbers: {value!r}")
    return tuple(value)


def _kv_type(value: object) -> str:
    """A remembered KV cache type: one llama.cpp knows."""
    if not isinstance(value, str) or value not in KV_TYPES:
        raise ValueError(f"unknown KV type {value!r}")
    return value


def _draft(value: object) -> str | None:
    """A remembered draft mode: one llama-server knows, or none (older memos have no such field)."""
    if value is None:
        return None
    if value not in DRAFT_ARGV:
        raise ValueError(f"unknown draft mode {value!r}")
    return str(value)
