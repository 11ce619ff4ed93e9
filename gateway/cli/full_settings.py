"""The gateway's full settings: the generic ones (:mod:`gateway.core.settings`) with every engine's own.

Each backend declares its settings (``Backend.settings_model``: fields, help, flags) and which of them
pin an engine flag (``Backend.pins``); the registry gathers them into one class
(``registry.EngineSettings``) and this module mixes that into the gateway's, so the CLI flags, the
``GATEWAY_*`` variables, gateway.toml and the README table still come from one declaration per
setting, and a new engine brings its own without touching the gateway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from gateway.backends import registry
from gateway.core import settings as core


class Settings(core.Settings, registry.EngineSettings):
    """Everything a user can set: the gateway's settings and every engine's own."""

    engine_pins: ClassVar[tuple[str, ...]] = tuple(name for backend in registry.BACKENDS for name in backend.pins)
    file_pins: ClassVar[tuple[str, ...]] = tuple(name for backend in registry.BACKENDS for name in backend.file_pins)

    # the generic field, with the registry's names as its choices
    engine: str | None = Field(
        None,
        description=f"Plan and serve only this engine ({', '.join(registry.names())}); unset: the first that fits.",
        json_schema_extra={"flags": ["--engine", "--backend"], "choices": list(registry.names())},
    )

    @field_validator("engine")
    @classmethod
    def _engine_known(cls, value: str | None) -> str | None:
        if value is not None and value not in registry.names():
            raise ValueError(f"unknown engine {value!r}: use one of {', '.join(registry.names())}")
        return value


# every engine's own settings, by name: `plan` takes them all (they change the plan), as `serve` does
ENGINE_SETTINGS = tuple(name for backend in registry.BACKENDS for name in backend.settings_model.model_fields)
SETTING_NAMES = (*core.Settings.model_fields, *ENGINE_SETTINGS)  # the gateway's first, then each engine's


def load_settings(overrides: dict[str, Any] | None = None, config_file: Path | None = None) -> Settings:
    """:func:`gateway.core.settings.load_settings` for the full settings."""
    return core.load_settings(Settings, overrides, config_file)
