"""The quantized variants of a hub model, found the way a person would find them, through
``huggingface_hub``:

1. the repositories that declare the model as their quantized base (the hub's
   ``base_model:quantized:<id>`` tag, set from a model card's ``base_model`` + ``base_model_relation``);
2. the model's own organisation's repositories named after it (``-FP8``, ``-AWQ``, ``-GPTQ-Int4``,
   ``-GGUF``…), which do not always carry that tag;
3. the well-known GGUF publishers' repositories named after it.

GGUF publishers are ranked in :data:`TRUSTED_GGUF` order (llama.cpp's own ``ggml-org`` first, then the
model's organisation, then the publishers whose quantizations the llama.cpp community relies on);
others after them, and download counts break ties. Each quantization type is taken from the best
ranked repository that has it, with its size; split files (``-00001-of-00003.gguf``) are one variant.
Checkpoints for vLLM (FP8, AWQ, GPTQ, NVFP4, MXFP4) are ranked the same way, one per method.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.files import replace_atomically
from gateway.core.hub_errors import hub_error

# GGUF publishers in trusted order; the model's own organisation is placed second at search time
TRUSTED_GGUF = ("ggml-org", "unsloth", "bartowski", "lmstudio-community")
# quantized-checkpoint publishers after the model's own organisation
TRUSTED_CHECKPOINTS = ("RedHatAI", "nvidia", "unsloth")
GGUF_REPOS_READ = 4  # repositories whose file lists are read (best ranked first)

# the quantization type in a GGUF file name: Q4_K_M, IQ4_XS, Q8_0, MXFP4, BF16…
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(IQ[1-4]_(?:XXS|XS|S|M|NL)|Q[2-6]_K(?:_[SML]|_XL)?|Q[4-8]_[01]|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32)"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# a checkpoint's quantization method from its repository name
_METHOD = (
    ("nvfp4", re.compile(r"nvfp4|[-_]fp4", re.I)),
    ("mxfp4", re.compile(r"mxfp4", re.I)),
    ("fp8", re.compile(r"fp8", re.I)),
    ("awq", re.compile(r"awq", re.I)),
    ("gptq", re.compile(r"gptq|w4a16", re.I)),
)


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


@dataclass(frozen=True)
class CheckpointVariant:
    """A pre-quantized checkpoint vLLM can load."""

    repo: str
    quantization: str  # fp8 | awq | gptq | nvfp4 | mxfp4
    rank: tuple[int, int]


@dataclass
class Variants:
    model: str
    gguf: list[GgufVariant] = field(default_factory=list)  # one per quantization type, largest first
    checkpoints: list[CheckpointVariant] = field(default_factory=list)  # one per method, best first
    searched: list[str] = field(default_factory=list)  # the repositories whose files were listed
    offline: bool = False  # remembered from the last search (the hub was not asked)

    def gguf_by(self, pin: str) -> GgufVariant | None:
        """The variant a ``--quant`` pin names: a quantization type or a file name."""
        for variant in self.gguf:
            if (
                variant.quant.lower() == pin.lower()
                or pin in variant.files
                or any(f.endswith(pin) for f in variant.files)
            ):
                return variant
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gguf": [{"repo": v.repo, "files": list(v.files), "size": v.size, "quant": v.quant} for v in self.gguf],
            "checkpoints": [{"repo": c.repo, "quantization": c.quantization} for c in self.checkpoints],
            "searched": self.searched,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Variants:
        return cls(
            model=str(data["model"]),
            gguf=[
                GgufVariant(str(v["repo"]), tuple(v["files"]), int(v["size"]), str(v["quant"]), (0, 0))
                for v in data.get("gguf", [])
            ],
            checkpoints=[
                CheckpointVariant(str(c["repo"]), str(c["quantization"]), (0, 0)) for c in data.get("checkpoints", [])
            ],
            searched=list(data.get("searched", [])),
        )


def quant_of(file_name: str) -> str:
    """'Qwen3-8B-Q4_K_M.gguf' → 'Q4_K_M' (upper case); '' when the name carries no type."""
    found = _QUANT.findall(file_name.rsplit("/", 1)[-1])
    return found[-1].upper() if found else ""


def group_gguf_files(files: Iterable[tuple[str, int | None]]) -> list[tuple[tuple[str, ...], int]]:
    """(parts, total size) per GGUF in a repository listing; split parts grouped in order, a
    projector (``mmproj``) or an incomplete split left out."""
    groups: dict[str, list[tuple[int, str, int]]] = {}
    counts: dict[str, int] = {}
    for name, size in files:
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


def method_of(repo: str, tags: Iterable[str] = ()) -> str | None:
    """A checkpoint's quantization method from its name (and tags); None: not a quantized checkpoint."""
    text = " ".join([repo.split("/")[-1], *(t for t in tags if ":" not in t)])
    for method, pattern in _METHOD:
        if pattern.search(text):
            return method
    return None


# what may follow the model's name in a quantized repository's name ("-GGUF", "-FP8-Dynamic", "-GPTQ-Int4",
# ".w4a16"); anything else ("-Base", "-1M", "-abliterated") is another model
_QUANT_SUFFIX = re.compile(
    r"([-_.](gguf|fp8|dynamic|awq|gptq|int4|int8|nvfp4|fp4|mxfp4|w4a16|w8a8|w4a4|quantized|bnb|4bit|8bit|imatrix|i1))+"
)


def named_after(repo: str, name: str) -> bool:
    """Whether a searched repository is a quantization of ``name`` by its name: the model's name,
    after at most one word of prefix ("Qwen_", "Meta-"), followed only by quantization words."""
    short, base = repo.split("/")[-1].lower(), name.lower()
    at = short.find(base)
    if at < 0:
        return False
    prefix, rest = short[:at], short[at + len(base) :]
    return (not prefix or re.fullmatch(r"[a-z0-9.]+[-_]", prefix) is not None) and (
        not rest or _QUANT_SUFFIX.fullmatch(rest) is not None
    )


def _is_gguf(repo: str, tags: Iterable[str]) -> bool:
    return "gguf" in {t.lower() for t in tags} or repo.lower().endswith("gguf")


def _trust(author: str, order: tuple[str, ...]) -> int:
    lowered = [name.lower() for name in order]
    return lowered.index(author.lower()) if author.lower() in lowered else len(order)


_FOUND: dict[tuple[str, str], Variants] = {}  # per process: both engines ask for the same model


def discover(model: str, api: Any = None) -> Variants:
    """Every variant of ``model`` the hub lists (I/O: a handful of API calls, no file is downloaded).

    ``api``: an ``HfApi`` (tests give one with their endpoint); default: the environment's
    (``HF_ENDPOINT``, ``HF_TOKEN``). A missing or gated base model raises ModelError naming the fix."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = api or HfApi()
    key = (model.lower(), str(api.endpoint))
    if key in _FOUND:
        return _FOUND[key]
    org, name = model.split("/", 1)
    try:
        named = api.model_info(model)
    except Exception as exc:  # HTTP errors, offline mode, and the transport's own (connection refused…)
        unreachable = isinstance(exc, OfflineModeIsEnabled) or not isinstance(exc, HfHubHTTPError)
        if unreachable and (remembered := _remembered(model)) is not None:
            _FOUND[key] = remembered
            return remembered  # offline: what the last search found (its downloaded files are in the cache)
        raise hub_error(model, exc) from exc
    found: dict[str, Any] = {}
    searches: list[dict[str, Any]] = [
        {"filter": f"base_model:quantized:{model}"},
        {"author": org, "search": name},
        *({"author": publisher, "search": name} for publisher in TRUSTED_GGUF),
    ]
    for query in searches:
        declared = "filter" in query  # the repository says it quantizes this model; a search only matches text
        try:
            for info in api.list_models(limit=100, sort="downloads", **query):
                if info.id.lower() != model.lower() and (declared or named_after(info.id, name)):
                    found.setdefault(info.id, info)
        except Exception:  # one search failing (HTTP or transport) leaves the others
            continue
    gguf_order = (TRUSTED_GGUF[0], org, *TRUSTED_GGUF[1:])
    checkpoint_order = (org, *TRUSTED_CHECKPOINTS)
    variants = Variants(model)
    gguf_repos = []
    if _is_gguf(model, named.tags or []):  # a GGUF repository named directly: its own files come first
        gguf_repos.append(((-1, 0), model))
    for repo_id, info in found.items():
        tags = list(info.tags or [])
        author = repo_id.split("/")[0]
        rank = (_trust(author, gguf_order), -int(info.downloads or 0))
        if _is_gguf(repo_id, tags):
            gguf_repos.append((rank, repo_id))
        elif method := method_of(repo_id, tags):
            variants.checkpoints.append(
                CheckpointVariant(repo_id, method, (_trust(author, checkpoint_order), -int(info.downloads or 0)))
            )
    variants.checkpoints = _best_per(variants.checkpoints, lambda c: c.quantization)
    by_quant: dict[str, GgufVariant] = {}
    for rank, repo_id in sorted(gguf_repos)[:GGUF_REPOS_READ]:
        try:
            info = api.model_info(repo_id, files_metadata=True)
        except Exception:  # a repository that cannot be listed is left out
            continue
        variants.searched.append(repo_id)
        listing = [(s.rfilename, s.size) for s in info.siblings or []]
        for parts, size in group_gguf_files(listing):
            quant = quant_of(parts[0]) or parts[0]
            if quant not in by_quant:  # repositories come best first: the first holder of a type keeps it
                by_quant[quant] = GgufVariant(repo_id, parts, size, quant_of(parts[0]), rank)
    variants.gguf = sorted(by_quant.values(), key=lambda v: -v.size)
    _FOUND[key] = variants
    _remember(variants)
    return variants


def _record(model: str) -> Path:
    """Where the last search for ``model`` is kept, beside the hub cache (``HF_HOME``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "gateway-variants" / (model.replace("/", "--") + ".json")


def _remember(variants: Variants) -> None:
    with contextlib.suppress(OSError):  # a read-only cache: searching again next time is the only cost
        replace_atomically(_record(variants.model), json.dumps(variants.to_json(), indent=1))


def _remembered(model: str) -> Variants | None:
    try:
        found = Variants.from_json(json.loads(_record(model).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found.offline = True
    return found


def _best_per(items: list[CheckpointVariant], key: Any) -> list[CheckpointVariant]:
    best: dict[str, CheckpointVariant] = {}
    for item in sorted(items, key=lambda c: c.rank):
        best.setdefault(key(item), item)
    return sorted(best.values(), key=lambda c: c.rank)
