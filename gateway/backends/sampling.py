"""A model's recommended sampling: what its authors say a request without sampling fields should be
sampled with, and where that was read. A model fact beside :mod:`gateway.backends.model_facts`, which every
engine applies its own way: vLLM reads a checkpoint's ``generation_config.json`` itself
(``--generation-config auto``, its default), llama-server takes the values as its default flags
(``gateway/backends/llamacpp/argv.py``). A request's own fields always win on both.

Three sources, in order of trust: the checkpoint's ``generation_config.json`` (a local directory's,
or the hub's), the GGUF's ``general.sampling.*`` keys (``gateway/backends/llamacpp/gguf_facts.py``), and the
catalog entry's ``[sampling]`` table (the model card's values, with the card named as its source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.backends.checked import json_object
from gateway.core.errors import ModelError, shown
from gateway.hub.guard import guard_hub

if TYPE_CHECKING:
    from gateway.core.model_entry import ModelEntry

# (lowest, highest) each field may take; a value outside is left out with a note (a typo in someone's
# generation_config.json must not stop a plan, nor reach an engine that would refuse to start)
LIMITS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0),
    "top_p": (0.001, 1.0),
    "top_k": (-1, 1 << 20),  # -1 and 0: off
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.01, 100.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
# what a field the authors leave unsaid means: off, as vLLM leaves it (its SamplingParams defaults, which
# generation_config.json's values replace one by one) — not llama-server's own top_k 40, min_p 0.05 and
# temperature 0.8, so that a model is sampled alike on either engine
UNSAID: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True)
class Sampling:
    """The sampling a model's authors recommend (None: unsaid) and where it was read."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    source: str = ""  # "generation_config.json of Qwen/Qwen3-8B", "general.sampling.* of m.gguf", "catalog: …"
    notes: tuple[str, ...] = field(default=(), compare=False)  # values left out, and why

    @property
    def recommends(self) -> bool:
        """Whether the source gave any value (a Sampling without one carries only notes)."""
        return bool(self.given())

    def given(self) -> dict[str, float]:
        """The fields the source gives, in LIMITS' order."""
        return {name: value for name in LIMITS if (value := getattr(self, name)) is not None}

    def complete(self) -> dict[str, float]:
        """Every field: the source's values, the rest as vLLM leaves them (:data:`UNSAID`)."""
        return UNSAID | self.given()

    def phrase(self) -> str:
        """ "temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05" """
        return ", ".join(f"{name} {value:g}" for name, value in self.given().items())


def checked(values: dict[str, Any], source: str) -> Sampling | None:
    """A Sampling of the known fields in ``values`` within their limits (others left out, each with a
    note); None when none is given."""
    kept: dict[str, float] = {}
    notes: list[str] = []
    for name, (low, high) in LIMITS.items():
        value = values.get(name)
        if value is None:
            continue
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number) or not low <= number <= high:
            within = f"a number from {_number(low)} to {_number(high)}"
            notes.append(f"{source}: {name} = {shown(value)} left out ({within})")
            continue
        if name == "top_k":
            if number != int(number):
                notes.append(f"{source}: top_k = {shown(value)} left out (a whole number)")
                continue
            number = max(int(number), 0)  # -1 (transformers' and vLLM's "off") is llama.cpp's 0
        kept[name] = number
    if not kept:
        return Sampling(source=source, notes=tuple(notes)) if notes else None
    return Sampling(**kept, source=source, notes=tuple(notes))  # type: ignore[arg-type]


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def from_generation_config(config: dict[str, Any], where: str) -> Sampling | None:
    """The sampling fields of a ``generation_config.json`` as vLLM applies them
    (``ModelConfig.get_diff_sampling_param``: every one the file gives, whatever ``do_sample`` says)."""
    return checked(config, f"generation_config.json of {where}")


def from_catalog(entry: ModelEntry) -> Sampling | None:
    """The catalog entry's ``[sampling]`` table (the model card's values), its source as the entry says."""
    table = entry.sampling
    if table is None:
        return None
    values = table.model_dump(exclude={"source"})
    return checked(values, f"catalog: {table.source}")


def read_generation_config(checkpoint: str) -> Sampling | None:
    """``generation_config.json`` of a checkpoint directory or a hub repository (I/O); None where there
    is none or it cannot be read (absent, gated, offline, not JSON): the next source is asked."""
    path = Path(checkpoint).expanduser()
    try:
        if path.is_dir():
            text = (path / "generation_config.json").read_bytes()
        else:
            from huggingface_hub import hf_hub_download

            guard_hub()
            text = Path(hf_hub_download(checkpoint, "generation_config.json")).read_bytes()
        return from_generation_config(json_object(text, f"generation_config.json of {checkpoint}"), checkpoint)
    except ModelError as exc:
        return Sampling(source=f"generation_config.json of {checkpoint}", notes=(str(exc),))
    except Exception:  # absent, gated or offline: not a recommendation, and not an error either
        return None


def first(*found: Sampling | None) -> Sampling | None:
    """The first source (in order of trust) that gives a value; the notes of every one read."""
    notes = tuple(note for sampling in found if sampling is not None for note in sampling.notes)
    chosen = next((s for s in found if s is not None and s.recommends), None)
    if chosen is None:
        return Sampling(notes=notes) if notes else None
    return replace(chosen, notes=notes)


def plan_json(sampling: Sampling | None, applied: str) -> dict[str, Any]:
    """A candidate's sampling in the plan's JSON: what the source gives and where it was read, every
    field the engine starts with, and how the engine applies it (``applied``); values empty and
    source null when nothing is recommended (the engine's own defaults stand)."""
    if sampling is None or not sampling.recommends:
        return {"values": {}, "source": None, "applied": applied}
    return {"values": sampling.given(), "source": sampling.source, "defaults": sampling.complete(), "applied": applied}


def plan_line(sampling: Sampling | None, applied: str) -> str:
    """The plan's one line: "sampling: temperature 0.2, top_p 0.9 (catalog: model card of …); llama-server's
    defaults (…); a request's own fields win"."""
    if sampling is None or not sampling.recommends:
        return f"sampling: none recommended (no generation_config.json, general.sampling.* or catalog); {applied}"
    return f"sampling: {sampling.phrase()} ({sampling.source}); {applied}"
