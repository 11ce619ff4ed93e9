"""A hub model's pre-quantized checkpoints that vLLM loads (FP8, AWQ, GPTQ, NVFP4, MXFP4): the
method read from the repository's name and tags, one per method, the model's own organisation first,
then :data:`TRUSTED_CHECKPOINTS`, download counts breaking ties. The search itself is engine-neutral
(:mod:`gateway.hub.search`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.backends.hub_formats import is_gguf
from gateway.hub.search import DECLARED, Repository, named_after, search, trust

# quantized-checkpoint publishers after the model's own organisation
TRUSTED_CHECKPOINTS = ("RedHatAI", "nvidia", "unsloth")
# a checkpoint's quantization method from its repository name
_METHOD = (
    ("nvfp4", re.compile(r"nvfp4|[-_]fp4", re.I)),
    ("mxfp4", re.compile(r"mxfp4", re.I)),
    ("fp8", re.compile(r"fp8", re.I)),
    ("awq", re.compile(r"awq", re.I)),
    ("gptq", re.compile(r"gptq|w4a16", re.I)),
)
# what may follow the model's name in a quantized checkpoint's name ("-FP8-Dynamic", "-GPTQ-Int4", ".w4a16")
NAME_SUFFIX = re.compile(
    r"([-_.](fp8|dynamic|awq|gptq|int4|int8|nvfp4|fp4|mxfp4|w4a16|w8a8|w4a4|quantized|bnb|4bit|8bit))+"
)


@dataclass(frozen=True)
class CheckpointVariant:
    """A pre-quantized checkpoint vLLM can load."""

    repo: str
    quantization: str  # fp8 | awq | gptq | nvfp4 | mxfp4
    rank: tuple[int, int]


def method_of(repo: str, tags: Iterable[str] = ()) -> str | None:
    """A checkpoint's quantization method from its name (and tags); None: not a quantized checkpoint."""
    text = " ".join([repo.split("/")[-1], *(t for t in tags if ":" not in t)])
    for method, pattern in _METHOD:
        if pattern.search(text):
            return method
    return None


def checkpoint_variants(model: str, api: Any = None) -> list[CheckpointVariant]:
    """The best checkpoint per quantization method, best first (I/O: the hub search)."""
    found = search(model, TRUSTED_CHECKPOINTS, api)
    org, name = model.split("/", 1)
    order = (org, *TRUSTED_CHECKPOINTS)
    best: dict[str, CheckpointVariant] = {}
    ranked = [
        CheckpointVariant(repo.id, method, (trust(repo.author, order), -repo.downloads))
        for repo in found.repositories.values()
        if _ours(repo, name) and (method := method_of(repo.id, repo.tags))
    ]
    for variant in sorted(ranked, key=lambda c: c.rank):
        best.setdefault(variant.quantization, variant)
    return sorted(best.values(), key=lambda c: c.rank)


def _ours(repo: Repository, name: str) -> bool:
    if is_gguf(repo.id, repo.tags):
        return False  # llama.cpp's files, not a checkpoint
    declared = DECLARED in repo.via
    return repo.found_by(TRUSTED_CHECKPOINTS) and (declared or named_after(repo.id, name, NAME_SUFFIX))
