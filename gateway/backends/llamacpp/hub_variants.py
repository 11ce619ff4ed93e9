"""The GGUF variants of a hub model as llama.cpp would load them: each one's facts from its header,
read over range requests (or from the hub cache when downloaded), its quantization checked against
the header's ``general.file_type``. When a header cannot be read the sizes are estimated from
config.json at the type's bits per weight, and the facts say so."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.backends.checked import integer
from gateway.backends.llamacpp.gguf_facts import GGUF_BITS_PER_WEIGHT, GgufFacts, estimate_gguf_facts, facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import GgufHeader
from gateway.backends.llamacpp.hub_gguf import GgufVariant
from gateway.backends.llamacpp.remote_gguf import read_header, read_local
from gateway.backends.model_facts import facts_from_config
from gateway.core.errors import ModelError
from gateway.hub.errors import hub_error
from gateway.hub.fetch import cached
from gateway.hub.guard import MAX_DECLARED, guard_hub

# llama.cpp's ``llama_ftype`` (general.file_type) → the type name files are named after
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4", 39: "NVFP4",
}  # fmt: skip


@dataclass
class ReadVariant:
    """One variant with the facts llama.cpp plans from, and what the header said about it."""

    variant: GgufVariant
    facts: GgufFacts
    quant: str  # the header's type when it has one, else the name's
    local: Path | None = None  # the first part, when already in the hub cache
    chat_template: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.variant.label

    @property
    def path(self) -> str:
        """Where llama.cpp reads it: the local first part once downloaded, else repo/first part (plan)."""
        return str(self.local) if self.local else f"{self.variant.repo}/{self.variant.files[0]}"


def checked_quant(variant: GgufVariant, header: GgufHeader) -> tuple[str, str | None]:
    """(the quantization, a note when the file's name and its header disagree: the header wins)."""
    file_type = header.metadata.get("general.file_type")
    said = FILE_TYPES.get(int(file_type)) if isinstance(file_type, int) else None
    named = variant.quant
    if said is None:
        return named, None
    if named and said.split("_MOE")[0] != named.split("_MOE")[0] and not said.startswith(named):
        return said, f"{variant.label}: named {named} but its header says {said}; planned as {said}"
    return said, None


def read_variant(variant: GgufVariant, name: str, config: dict[str, Any] | None, endpoint: str | None) -> ReadVariant:
    """Facts from the header (local when cached, else over range requests); estimated when unreadable."""
    parts = [cached(variant.repo, f) for f in variant.files]
    local = parts[0] if all(parts) else None
    try:
        if local is not None:
            header = read_local([p for p in parts if p is not None])
        else:
            sizes = _part_sizes(variant)
            header = read_header(variant.repo, variant.files, sizes, endpoint)
    except ModelError as exc:
        return _estimated(variant, name, config, str(exc))
    quant, note = checked_quant(variant, header)
    facts = facts_from_gguf(header, name, variant.label)
    facts = replace(facts, quantization=quant, weight_bytes_source=f"GGUF tensor table ({quant})")
    template = header.metadata.get("tokenizer.chat_template")
    return ReadVariant(
        variant, facts, quant, local, template if isinstance(template, str) else "", [note] if note else []
    )


def _part_sizes(variant: GgufVariant) -> tuple[int, ...]:
    """Each part's size; the listing gives the total, and parts of a split are read one by one."""
    if len(variant.files) == 1:
        return (variant.size,)
    from huggingface_hub import HfApi

    guard_hub()
    try:
        infos = HfApi().get_paths_info(variant.repo, list(variant.files))
    except Exception as exc:  # HTTP errors, offline mode, the transport's own, the guard's refusals
        raise hub_error(variant.repo, exc, f"the part sizes of {variant.files[0]}") from exc
    by_name = {info.path: getattr(info, "size", 0) or 0 for info in infos}
    return tuple(
        integer(by_name.get(f, 0), f"the hub's listing of {variant.repo}", f"size of {f}", 1, MAX_DECLARED)
        for f in variant.files
    )


def _estimated(variant: GgufVariant, name: str, config: dict[str, Any] | None, why: str) -> ReadVariant:
    bits = GGUF_BITS_PER_WEIGHT.get(variant.quant)
    if config is None or bits is None:
        raise ModelError(f"{variant.label}: header unreadable ({why}) and its size cannot be estimated")
    facts = estimate_gguf_facts(facts_from_config(config, name), config, bits)
    note = f"{variant.label}: header not read ({why}); sizes ESTIMATED at {bits} bits/weight"
    return ReadVariant(variant, facts, variant.quant, None, "", [note])
