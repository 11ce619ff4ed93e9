"""The model catalog: ``config/models/*.toml`` loaded into typed entries, and name resolution.

A user names a model four ways: a catalog name or alias, a local ``.gguf`` file, a local checkpoint
directory (with ``config.json``), or a hub repo id (``org/name``). All of them resolve here, in one
place, to a :class:`ModelEntry`; anything else raises :class:`~gateway.errors.ModelError` listing the
names that would have worked.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from gateway.errors import ModelError

DEFAULT_MODEL = "gemma-3-270m"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuantizedCheckpoint(_Strict):
    """A pre-quantized variant the planner may step down to when the original does not fit."""

    checkpoint: str
    quantization: str  # fp8 | nvfp4 | awq | gptq | mxfp4
    checkpoint_bytes: int | None = None  # unset: estimated from the architecture


class VllmSource(_Strict):
    """How vLLM gets the model: a hub repo or local directory, and the parsers agents need."""

    checkpoint: str
    checkpoint_bytes: int | None = None  # the safetensors total when known; unset: estimated
    quantized: tuple[QuantizedCheckpoint, ...] = ()
    dtype: str = "auto"
    quantization: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None


class LlamaCppSource(_Strict):
    """Where the GGUF comes from: exactly one of a local path, a hub repo/file, or a Python package."""

    gguf_path: str | None = None
    gguf_repo: str | None = None
    gguf_file: str | None = None
    gguf_package: str | None = None
    gguf_pip: str | None = None  # the distribution that provides gguf_package, for the install hint
    chat_format: str | None = None  # llama-cpp-python's name; unset: the GGUF's own template

    @model_validator(mode="after")
    def _one_source(self) -> LlamaCppSource:
        kinds = [bool(self.gguf_path), bool(self.gguf_repo or self.gguf_file), bool(self.gguf_package)]
        if sum(kinds) != 1:
            raise ValueError("give exactly one of gguf_path, gguf_repo+gguf_file, gguf_package")
        if bool(self.gguf_repo) != bool(self.gguf_file):
            raise ValueError("gguf_repo and gguf_file go together")
        return self


class ModelEntry(_Strict):
    """One model as the gateway fronts it."""

    name: str
    aliases: tuple[str, ...] = ()
    description: str = ""
    max_context: int | None = None  # the model's own limit when known without reading weights
    hf_config: str | None = None  # a config.json shipped beside the catalog (relative to it), for planning offline
    vllm: VllmSource | None = None
    llamacpp: LlamaCppSource | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def builtin_catalog_dir() -> Path:
    """``config/models`` from a source checkout, or its copy inside an installed wheel."""
    package_dir = Path(__file__).resolve().parent
    for candidate in (package_dir / "_config" / "models", package_dir.parent / "config" / "models"):
        if candidate.is_dir():
            return candidate
    raise ModelError(f"model catalog not found next to {package_dir}: reinstall the gateway package")


def parse_entry(text: str, source: str) -> ModelEntry:
    """Parse one catalog file; errors name the file and the key path."""
    try:
        return ModelEntry.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{source}: not valid TOML: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ModelError(f"{source}: {where}: {first['msg']}") from exc


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
        return cls(parse_entry(path.read_text(), str(path)) for path in files)

    def get(self, name: str) -> ModelEntry | None:
        return self._by_name.get(name.lower())

    def resolve(self, spec: str) -> ModelEntry:
        """Turn what the user typed into an entry (see the module docstring for the forms)."""
        if entry := self.get(spec):
            return entry
        path = Path(spec).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            return ModelEntry(name=path.stem, llamacpp=LlamaCppSource(gguf_path=str(path.resolve())))
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelError(f"{path} has no config.json: point --model at a checkpoint directory or a .gguf file")
            return ModelEntry(name=path.resolve().name, vllm=VllmSource(checkpoint=str(path.resolve())))
        if path.suffix == ".gguf" or spec.startswith(("/", "./", "../", "~")):
            raise ModelError(f"{spec}: no such file or directory")
        if spec.count("/") == 1 and all(spec.split("/")):
            return ModelEntry(name=spec, vllm=VllmSource(checkpoint=spec))
        known = ", ".join(entry.name for entry in self.entries)
        raise ModelError(
            f"unknown model {spec!r}: use a catalog name ({known}), a hub repo id like org/name, "
            "a .gguf file or a checkpoint directory"
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
