"""A hub model's GGUF quantizations: which repositories hold them, every file with its size, split
files (``-00001-of-00003.gguf``) as one variant, the quantization type read from the file name.

Publishers are ranked in :data:`TRUSTED_GGUF` order (llama.cpp's own ``ggml-org`` first, then the
model's organisation, then the publishers whose quantizations the llama.cpp community relies on);
others after them, and download counts break ties. Each quantization type is taken from the best
ranked repository that has it. The search itself is engine-neutral (:mod:`gateway.hub.search`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.backends.hub_formats import is_gguf
from gateway.hub.search import DECLARED, Repository, files, named_after, search, trust

# GGUF publishers in trusted order; the model's own organisation is placed second at search time
TRUSTED_GGUF = ("ggml-org", "unsloth", "bartowski", "lmstudio-community")
REPOS_READ = 4  # repositories whose file lists are read (best ranked first)

# the quantization type in a GGUF file name: Q4_K_M, IQ4_XS, Q8_0, MXFP4, BF16…
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(IQ[1-4]_(?:XXS|XS|S|M|NL)|Q[2-6]_K(?:_[SML]|_XL)?|Q[4-8]_[01]|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32)"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# what may follow the model's name in a GGUF repository's name ("-GGUF", "-i1-GGUF", "-imatrix")
NAME_SUFFIX = re.compile(r"([-_.](gguf|imatrix|i1|quantized|fp8|int4|int8|4bit|8bit))+")


@dataclass(frozen=True)
class GgufVariant:
    """One GGUF quantization of the model: its file(s) in one repository, their total size."""

    repo: str
    files: tuple[str, ...]  # the split parts in order; one name for an unsplit file
    size: int
    quant: str  # from the file name ("Q4_K_M"); "" when the name says none
    rank: tuple[int, int]  # (publisher trust, -downloads): lower is better

    @property
    def label(self) -> str:
        parts = f" ({len(self.files)} parts)" if len(self.files) > 1 else ""
        return f"{self.repo}/{self.files[0]}{parts}"


@dataclass
class GgufFound:
    model: str
    variants: list[GgufVariant]  # one per quantization type, largest first
    searched: list[str]  # the repositories whose files were listed
    offline: bool  # from the last search remembered (the hub was not asked)

    def by(self, pin: str) -> GgufVariant | None:
        """The variant a ``--quant`` pin names: a quantization type or a file name."""
        for variant in self.variants:
            if (
                variant.quant.lower() == pin.lower()
                or pin in variant.files
                or any(f.endswith(pin) for f in variant.files)
            ):
                return variant
        return None


def quant_of(file_name: str) -> str:
    """'Qwen3-8B-Q4_K_M.gguf' → 'Q4_K_M' (upper case); '' when the name carries no type."""
    found = _QUANT.findall(file_name.rsplit("/", 1)[-1])
    return found[-1].upper() if found else ""


def group_gguf_files(listing: Iterable[tuple[str, int | None]]) -> list[tuple[tuple[str, ...], int]]:
    """(parts, total size) per GGUF in a repository listing; split parts grouped in order, a
    projector (``mmproj``) or an incomplete split left out."""
    groups: dict[str, list[tuple[int, str, int]]] = {}
    counts: dict[str, int] = {}
    for name, size in listing:
        if not name.endswith(".gguf") or "mmproj" in name.lower():
            continue
        if match := _SPLIT.search(name):
            stem = name[: match.start()]
            groups.setdefault(stem, []).append((int(match.group(1)), name, int(size or 0)))
            counts[stem] = int(match.group(2))
        else:
            groups[name] = [(1, name, int(size or 0))]
            counts[name] = 1
    out = []
    for stem, parts in groups.items():
        parts.sort()
        if len(parts) == counts[stem]:
            out.append((tuple(name for _, name, _ in parts), sum(size for *_, size in parts)))
    return out


def gguf_variants(model: str, api: Any = None) -> GgufFound:
    """Every GGUF quantization of ``model`` the hub lists (I/O: the search and a few file listings)."""
    found = search(model, TRUSTED_GGUF, api)
    org, name = model.split("/", 1)
    order = (TRUSTED_GGUF[0], org, *TRUSTED_GGUF[1:])
    repos: list[tuple[tuple[int, int], str]] = []
    if is_gguf(model, found.tags):  # a GGUF repository named directly: its own files come first
        repos.append(((-1, 0), model))
    repos += [(_rank(repo, order), repo.id) for repo in found.repositories.values() if _ours(repo, name)]
    by_quant: dict[str, GgufVariant] = {}
    searched = []
    for rank, repo_id in sorted(repos)[:REPOS_READ]:
        listing = files(found, repo_id, api)
        if listing is None:
            continue
        searched.append(repo_id)
        for parts, size in group_gguf_files(listing):
            quant = quant_of(parts[0]) or parts[0]
            if quant not in by_quant:  # repositories come best first: the first holder of a type keeps it
                by_quant[quant] = GgufVariant(repo_id, parts, size, quant_of(parts[0]), rank)
    return GgufFound(model, sorted(by_quant.values(), key=lambda v: -v.size), searched, found.offline)


def _ours(repo: Repository, name: str) -> bool:
    declared = DECLARED in repo.via
    return (
        repo.found_by(TRUSTED_GGUF)
        and is_gguf(repo.id, repo.tags)
        and (declared or named_after(repo.id, name, NAME_SUFFIX))
    )


def _rank(repo: Repository, order: tuple[str, ...]) -> tuple[int, int]:
    return (trust(repo.author, order), -repo.downloads)
