"""One model as the gateway fronts it: the typed form of a ``config/models/*.toml`` entry.

It sits at the bottom because every engine reads it (each engine's table is typed by that engine's
backend, held here as ``Any``); the catalog that loads and resolves entries lives in
:mod:`gateway.planning.catalog`, above the engines it asks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.core.errors import ModelError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingTable(_Strict):
    """The catalog's ``[sampling]`` table: the sampling the model's card recommends, and where it says so.
    The least trusted source (gateway/backends/sampling.py): a checkpoint's generation_config.json and a GGUF's
    general.sampling.* keys come first."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    source: str = Field(min_length=1)  # the card (its address) or the file the values were copied from


class ModelEntry(_Strict):
    """One model as the gateway fronts it."""

    name: str
    aliases: tuple[str, ...] = ()
    description: str = ""
    max_context: int | None = None  # the model's own limit when known without reading weights
    hf_config: str | None = None  # a config.json shipped beside the entry (relative to its file), for planning offline
    sampling: SamplingTable | None = None  # the model card's recommended sampling (its source named)
    # one table per engine that can serve it ([vllm], [llamacpp]…), typed by that engine's backend
    engines: dict[str, Any] = Field(default_factory=dict)
    base_dir: Path | None = Field(default=None, exclude=True)  # the entry file's directory: relative paths start here
    # the known-good configuration of this model on this machine (serve), so engines need not search again
    remembered: dict[str, Any] | None = Field(default=None, exclude=True)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def source(self, engine: str) -> Any:
        """This engine's table (its backend's typed source), or None."""
        return self.engines.get(engine)

    def bundled_config(self) -> dict[str, Any] | None:
        """The config.json the entry ships (``hf_config``), read relative to the entry's own file."""
        if not self.hf_config:
            return None
        path = (self.base_dir or builtin_catalog_dir()) / self.hf_config
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"{self.name}: cannot read hf_config {path}: {exc}; fix the path in its catalog entry"
            ) from exc

    def to_json(self) -> dict[str, Any]:
        """The entry as its TOML file says it (engine tables at the top level)."""
        data = self.model_dump(mode="json", exclude={"engines"})
        return data | {name: source.model_dump(mode="json") for name, source in self.engines.items()}


def builtin_catalog_dir() -> Path:
    """``config/models`` from a source checkout, or its copy inside an installed wheel."""
    package_dir = Path(__file__).resolve().parents[1]  # gateway/
    for candidate in (package_dir / "_config" / "models", package_dir.parent / "config" / "models"):
        if candidate.is_dir():
            return candidate
    raise ModelError(f"model catalog not found next to {package_dir}: reinstall the gateway package")
