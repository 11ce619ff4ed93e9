"""The model catalog: ``config/models/*.toml`` loaded into typed entries, and name resolution.

A user names a model four ways: a catalog name or alias, a local ``.gguf`` file, a local checkpoint
directory (with ``config.json``), or a hub repo id (``org/name``). All of them resolve here, in one
place, to a :class:`ModelEntry`; anything else raises :class:`~gateway.core.errors.ModelError` listing the
names that would have worked.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.backends import registry
from gateway.core.errors import ModelError, shown
from gateway.core.model_entry import ModelEntry, builtin_catalog_dir
from gateway.hub.names import check_repo_id

DEFAULT_MODEL = "smollm2-135m-instruct"


def _key_error(source: str, exc: ValidationError, prefix: tuple[str, ...] = ()) -> ModelError:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in (*prefix, *first["loc"])) or "(top level)"
    return ModelError(f"{source}: {where}: {first['msg']}")


def parse_entry(text: str, source: str, base_dir: Path | None = None) -> ModelEntry:
    """Parse one catalog file; errors name the file and the key path. Each engine's table is parsed
    by that engine's backend; a table no engine claims is an error naming the known ones."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{source}: not valid TOML: {exc}") from exc
    engines: dict[str, Any] = {}
    for key in [k for k in data if k not in ModelEntry.model_fields]:
        if key not in registry.names():
            known = ", ".join(registry.names())
            raise ModelError(f"{source}: {key}: unknown key (engine tables are {known})")
        table = data.pop(key)
        try:
            engines[key] = registry.get(key).parse_section(table)
        except ValidationError as exc:
            raise _key_error(source, exc, (key,)) from exc
    try:
        return ModelEntry.model_validate({**data, "engines": engines, "base_dir": base_dir})
    except ValidationError as exc:
        raise _key_error(source, exc) from exc


class Catalog:
    """Catalog entries indexed by every name and alias (case-insensitive)."""

    def __init__(self, entries: Iterable[ModelEntry]) -> None:
        self.entries = tuple(entries)
        self._by_name: dict[str, ModelEntry] = {}
        for entry in self.entries:
            for name in entry.names:
                key = name.lower()
                if self._by_name.get(key, entry) is not entry:
                    raise ModelError(f"catalog: name {name!r} is used by two models")
                self._by_name[key] = entry

    @classmethod
    def from_dir(cls, directory: Path) -> Catalog:
        files = sorted(directory.glob("*.toml"))
        return cls(parse_entry(path.read_text(), str(path), path.parent) for path in files)

    def get(self, name: str) -> ModelEntry | None:
        return self._by_name.get(name.lower())

    def resolve(self, spec: str) -> ModelEntry:
        """Turn what the user typed into an entry (see the module docstring for the forms)."""
        if entry := self.get(spec):
            return entry
        path = Path(spec).expanduser()
        endings = tuple(ending for backend in registry.BACKENDS for ending in backend.model_files)
        hub_like = spec.count("/") == 1 and not spec.startswith((".", "~"))
        hub_like = hub_like and not spec.lower().endswith((*endings, ".json", ".safetensors", ".bin"))
        try:
            on_disk = path.exists()
        except OSError as exc:  # a name too long for this file system, for one
            if hub_like:
                check_repo_id(spec)
            raise ModelError(f"{shown(spec)}: {exc.strerror or exc}: pass a file, a directory or a hub id") from exc
        if not on_disk and hub_like:
            check_repo_id(spec)  # org/name is taken as a hub id: one huggingface_hub accepts, or one line
        files = " or ".join(f"a {ending} file" for ending in endings) or "a model file"
        # a file, a directory or a hub id: every engine that can load it gets its table (a hub id:
        # vLLM its checkpoints, llama.cpp its GGUF quantizations)
        engines = {
            backend.name: backend.parse_section(table)
            for backend in registry.BACKENDS
            if (table := backend.section_for(spec)) is not None
        }
        if engines:
            name = (path.resolve().stem if path.is_file() else path.resolve().name) if path.exists() else spec
            return ModelEntry(name=name, engines=engines)
        if path.is_dir():
            raise ModelError(f"{path} has no config.json: point --model at a checkpoint directory or {files}")
        if path.exists() or path.suffix in endings or spec.startswith(("/", "./", "../", "~")):
            raise ModelError(f"{spec}: no such file or directory" if not path.exists() else f"{spec}: not a model")
        known = ", ".join(entry.name for entry in self.entries)
        raise ModelError(
            f"unknown model {spec!r}: use a catalog name ({known}), a hub repo id like org/name, "
            f"{files} or a checkpoint directory"
        )


@cache
def builtin_catalog() -> Catalog:
    return Catalog.from_dir(builtin_catalog_dir())


def catalog_with(extra_dir: Path | None) -> Catalog:
    """The built-in catalog plus the user's entries; a user entry replaces a built-in of the same name."""
    if extra_dir is None:
        return builtin_catalog()
    if not extra_dir.is_dir():
        raise ModelError(f"catalog_dir {extra_dir} is not a directory: create it or unset catalog_dir")
    user = Catalog.from_dir(extra_dir)
    taken = {name.lower() for entry in user.entries for name in entry.names}
    kept = [entry for entry in builtin_catalog().entries if not taken & {name.lower() for name in entry.names}]
    return Catalog([*user.entries, *kept])
