"""Engine plans from facts held in memory, for planner tests that read no files."""

from __future__ import annotations

from backends import llamacpp, vllm
from backends.base import Installation
from gateway.core.model_facts import ModelFacts
from gateway.planning.planner import EnginePlan


def engine_plans(
    name: str,
    *,
    checkpoints: list[vllm.Checkpoint] | None = None,
    gguf_facts: ModelFacts | None = None,
    gguf: str = "model.gguf",
    chat_format: str | None = None,
    vllm_version: str = vllm.DEFAULT_VERSION,
    launcher: str = "python",
    parsers: tuple[str | None, str | None] = (None, None),
) -> list[EnginePlan]:
    """Both engines, as the registry orders them; an engine without facts has no model (not planned)."""
    vllm_model = vllm.VllmModel(name, list(checkpoints), *parsers) if checkpoints else None
    source = llamacpp.LlamaCppSource(gguf_path=gguf, chat_format=chat_format)
    llama_model = llamacpp.LlamaCppModel(name, source, gguf_facts, gguf) if gguf_facts else None
    return [
        EnginePlan(vllm.BACKEND, Installation(None, vllm_version, "given"), vllm_model),
        EnginePlan(llamacpp.BACKEND, Installation(("python",), "0.3.36", "llama-cpp-python", launcher), llama_model),
    ]
