"""The gateway's full settings: the generic ones (:mod:`gateway.core.settings`) with every engine's own.

Each backend declares its settings (``Backend.settings_model``: fields, help, flags) and which of them
pin an engine flag (``Backend.pins``); this module mixes them into one class, so the CLI flags, the
``GATEWAY_*`` variables, gateway.toml and the README table still come from one declaration per
setting, and a new engine brings its own without touching the gateway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pydantic import field_validator

from backends import registry
from gateway.core import settings as core


def _engine_known(_cls: type, value: str | None) -> str | None:
    if value is not None and value not in registry.names():
        raise ValueError(f"unknown engine {value!r}: use one of {', '.join(registry.names())}")
    return value


def _compose() -> type[core.Settings]:
    mixins = tuple(backend.settings_model for backend in registry.BACKENDS)
    composed = cast(
        type[core.Settings],
        type(
            "Settings",
            (core.Settings, *mixins),
            {
                "__module__": __name__,
                "__doc__": "Everything a user can set: the gateway's settings and every engine's own.",
                "engine_pins": tuple(name for backend in registry.BACKENDS for name in backend.pins),
                "file_pins": tuple(name for backend in registry.BACKENDS for name in backend.file_pins),
                "_engine_known": field_validator("engine")(classmethod(_engine_known)),
            },
        ),
    )
    engine = composed.model_fields["engine"]
    names = ", ".join(registry.names())
    engine.description = f"Plan and serve only this engine ({names}); unset: the first that fits."
    engine.json_schema_extra = {"flags": ["--engine", "--backend"], "choices": list(registry.names())}
    return composed


Settings = _compose()
# every engine's own settings, by name: `plan` takes them all (they change the plan), as `serve` does
ENGINE_SETTINGS = tuple(name for backend in registry.BACKENDS for name in backend.settings_model.model_fields)
SETTING_NAMES = (*core.Settings.model_fields, *ENGINE_SETTINGS)  # the gateway's first, then each engine's


def load_settings(overrides: dict[str, Any] | None = None, config_file: Path | None = None) -> core.Settings:
    """:func:`gateway.core.settings.load_settings` for the full settings."""
    return core.load_settings(overrides, config_file, Settings)
