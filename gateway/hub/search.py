"""What the hub lists for a model, found the way a person would find it, through ``huggingface_hub``:

1. the repositories that declare the model as their quantized base (the hub's
   ``base_model:quantized:<id>`` tag, set from a model card's ``base_model`` + ``base_model_relation``);
2. the model's own organisation's repositories that mention its name (``-FP8``, ``-AWQ``… do not
   always carry that tag);
3. each publisher an engine trusts for its formats, searched for the name.

Engine-neutral: which of these repositories an engine can load, and how it ranks them, is the engine's
(``gateway/backends/<engine>/hub_*.py``), which asks with its own publishers. Each repository remembers which
search found it, so an engine's answer does not depend on what another engine asked first. The search
and the file listings read are kept beside the hub cache, so ``HF_HUB_OFFLINE=1`` plans again from them.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.files import inside, replace_atomically
from gateway.hub.errors import hub_error
from gateway.hub.guard import MAX_DECLARED, guard_hub
from gateway.hub.names import check_repo_id, file_name_ok, repo_id_problem

DECLARED = "declared"  # found by the base_model:quantized filter
ORGANISATION = "organisation"  # found by searching the model's own organisation


@dataclass(frozen=True)
class Repository:
    id: str
    tags: tuple[str, ...] = ()
    downloads: int = 0
    via: frozenset[str] = frozenset()  # DECLARED, ORGANISATION, or the publisher whose search found it

    @property
    def author(self) -> str:
        return self.id.split("/")[0]

    def found_by(self, publishers: Iterable[str]) -> bool:
        """Found by a search this engine asked for: the generic ones or one of its publishers."""
        return bool(self.via & {DECLARED, ORGANISATION, *publishers})


@dataclass
class Search:
    """One model's search: the repositories found and the file listings read so far."""

    model: str
    tags: tuple[str, ...] = ()  # the named model's own
    repositories: dict[str, Repository] = field(default_factory=dict)
    publishers: list[str] = field(default_factory=list)  # publishers searched so far
    listings: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    offline: bool = False  # remembered from the last search (the hub was not asked)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tags": list(self.tags),
            "repositories": [
                {"id": r.id, "tags": list(r.tags), "downloads": r.downloads, "via": sorted(r.via)}
                for r in self.repositories.values()
            ],
            "publishers": self.publishers,
            "listings": {repo: [list(item) for item in files] for repo, files in self.listings.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Search:
        repositories = [
            Repository(str(r["id"]), tuple(r["tags"]), int(r["downloads"]), frozenset(r["via"]))
            for r in data["repositories"]
        ]
        return cls(
            model=str(data["model"]),
            tags=tuple(data["tags"]),
            repositories={r.id: r for r in repositories},
            publishers=list(data["publishers"]),
            listings={repo: [(str(n), int(s)) for n, s in files] for repo, files in data["listings"].items()},
        )


_SEARCHES: dict[tuple[str, str], Search] = {}  # per process: both engines ask about the same model


def search(model: str, publishers: Iterable[str] = (), api: Any = None) -> Search:
    """The repositories the hub lists for ``model`` (I/O: a handful of API calls, no file downloaded).

    ``api``: an ``HfApi`` (tests give one with their endpoint); default: the environment's
    (``HF_ENDPOINT``, ``HF_TOKEN``). A missing or gated base model raises ModelError naming the fix;
    an unreachable hub answers with the last search remembered, if any."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    check_repo_id(model)
    guard_hub()
    api = api or HfApi()
    key = (model.lower(), str(api.endpoint))
    found = _SEARCHES.get(key)
    learned = found is None  # written beside the cache only when it changed: a plan asks once per engine
    if found is None:
        try:
            named = api.model_info(model)
        except Exception as exc:  # HTTP errors, offline mode, and the transport's own (connection refused…)
            unreachable = isinstance(exc, OfflineModeIsEnabled) or not isinstance(exc, HfHubHTTPError)
            if unreachable and (remembered := _remembered(model)) is not None:
                _SEARCHES[key] = remembered
                return remembered
            raise hub_error(model, exc) from exc
        org, name = model.split("/", 1)
        found = Search(model, tuple(named.tags or []))
        _query(found, api, DECLARED, {"filter": f"base_model:quantized:{model}"})
        _query(found, api, ORGANISATION, {"author": org, "search": name})
        _SEARCHES[key] = found
    if not found.offline:
        name = model.split("/", 1)[1]
        for publisher in publishers:
            if publisher not in found.publishers:
                found.publishers.append(publisher)
                _query(found, api, publisher, {"author": publisher, "search": name})
                learned = True
        if learned:
            _remember(found)
    return found


def _query(found: Search, api: Any, via: str, query: dict[str, str]) -> None:
    try:
        for info in api.list_models(limit=100, sort="downloads", **query):
            if not isinstance(info.id, str) or repo_id_problem(info.id) or info.id.lower() == found.model.lower():
                continue  # the named model itself, or a name no repository can have
            old = found.repositories.get(info.id)
            seen = old.via if old else frozenset()
            found.repositories[info.id] = Repository(
                info.id, tuple(info.tags or []), int(info.downloads or 0), seen | {via}
            )
    except Exception:  # one search failing (HTTP or transport) leaves the others
        return


def files(found: Search, repo_id: str, api: Any = None) -> list[tuple[str, int]] | None:
    """(name, size) of every file in one repository, remembered with the search; None when it cannot be
    listed (offline and never read, or the hub refuses)."""
    if repo_id in found.listings:
        return found.listings[repo_id]
    if found.offline:
        return None
    from huggingface_hub import HfApi

    guard_hub()
    try:
        info = (api or HfApi()).model_info(repo_id, files_metadata=True)
        listed = [(s.rfilename, s.size or 0) for s in info.siblings or []]
    except Exception:  # a repository that cannot be listed is left out
        return None
    found.listings[repo_id] = [
        (name, size)
        for name, size in listed
        if isinstance(name, str) and file_name_ok(name) and isinstance(size, int) and 0 <= size <= MAX_DECLARED
    ]  # a name that would lead out of the cache, or a size no file has, is not a file to plan from
    _remember(found)
    return found.listings[repo_id]


def named_after(repo: str, name: str, suffix: re.Pattern[str]) -> bool:
    """Whether a searched repository is a quantization of ``name`` by its name: the model's name, after
    at most one word of prefix ("Qwen_", "Meta-"), followed only by what ``suffix`` allows (an engine's
    quantization words); anything else ("-Base", "-1M", "-abliterated") is another model."""
    short, base = repo.split("/")[-1].lower(), name.lower()
    at = short.find(base)
    if at < 0:
        return False
    prefix, rest = short[:at], short[at + len(base) :]
    return (not prefix or re.fullmatch(r"[a-z0-9.]+[-_]", prefix) is not None) and (
        not rest or suffix.fullmatch(rest) is not None
    )


def trust(author: str, order: tuple[str, ...]) -> int:
    """A publisher's place in ``order`` (case-insensitive); anyone else after all of them."""
    lowered = [name.lower() for name in order]
    return lowered.index(author.lower()) if author.lower() in lowered else len(order)


def _record(model: str) -> Path:
    """Where the last search for ``model`` is kept, beside the hub cache (``HF_HOME``)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HOME) / "gateway-search"
    return inside(folder, folder / (model.replace("/", "--") + ".json"), f"the search record of {model}")


def _remember(found: Search) -> None:
    with contextlib.suppress(OSError):  # a read-only cache: searching again next time is the only cost
        replace_atomically(_record(found.model), json.dumps(found.to_json(), indent=1))


def _remembered(model: str) -> Search | None:
    try:
        found = Search.from_json(json.loads(_record(model).read_text()))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    found.offline = True
    return found
