"""What one placement question asks: a model on some devices at a context, KV type, launcher and
draft mode. Every placement the search tries for one rung shares these; only the layer count, the
experts in RAM and the split vary (:func:`gateway.backends.llamacpp.placement.place`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.launcher import Launcher
from gateway.core.devices import Device


@dataclass(frozen=True)
class PlacementQuery:
    """The arguments every placement of one rung shares, passed as one value through the search."""

    facts: GgufFacts
    gpus: tuple[Device, ...]  # in llama.cpp's order (-ts follows it); () for CPU only
    n_ctx: int  # the unified cache's cells
    kv_type: str  # "f16", "q8_0", "q4_0"
    launcher: Launcher
    draft: str | None = None  # self-drafting (backends.llamacpp.drafting): "mtp", "ngram" or None

    @property
    def flash_attention(self) -> bool:
        return self.launcher.flash_attention(self.gpus)

    def with_context(self, n_ctx: int) -> PlacementQuery:
        """The same question at another size of cache (the room for sessions kept warm)."""
        return replace(self, n_ctx=n_ctx)
