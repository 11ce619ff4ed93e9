"""Which engine's files a hub repository holds, told from its name and tags before its files are
listed: llama.cpp loads a GGUF repository's files, vLLM never does. Both engines' hub searches ask the
same question of the same repositories, so the answer is written once."""

from __future__ import annotations

from collections.abc import Iterable


def is_gguf(repo: str, tags: Iterable[str]) -> bool:
    """Whether repository ``repo`` (org/name) with ``tags`` holds GGUF files: tagged ``gguf`` or so named."""
    return "gguf" in {t.lower() for t in tags} or repo.lower().endswith("gguf")
