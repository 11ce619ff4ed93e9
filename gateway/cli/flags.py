"""Command-line flags generated from :class:`~gateway.core.settings.Settings`: one declaration per setting
(name, type, help, default), so `serve`, `plan` and the TOML file cannot drift apart.

A setting's flag is ``--name-with-dashes`` unless its field lists ``flags`` (the first is shown, the
others are accepted aliases); ``parse`` says how a list is given (``shlex``: one shell-quoted
string, ``csv``: comma separated, ``append``: the flag repeats); ``choices`` limits the values.
Every flag defaults to None ("not given"), so only what the user typed overrides the environment
and gateway.toml.
"""

from __future__ import annotations

import argparse
import shlex
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from gateway.cli.full_settings import SETTING_NAMES, Settings
from gateway.core.settings import parse_count, parse_count_or_auto


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return dict(extra) if isinstance(extra, dict) else {}


def _base_type(annotation: Any) -> Any:
    """``int | None`` → int; ``list[str] | None`` → list."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return typing.get_origin(annotation) or annotation


def _csv(value: str) -> list[str]:
    return [part for part in value.split(",") if part]


def _help(info: FieldInfo) -> str:
    text = info.description or ""
    default = info.get_default(call_default_factory=True)
    if default not in (None, [], False) and not isinstance(default, Path):
        text += f" (default {default})"
    return text.replace("%", "%%")


def flag_names(name: str) -> list[str]:
    flags = _extra(Settings.model_fields[name]).get("flags")
    return list(flags) if flags else ["--" + name.replace("_", "-")]


def add_setting_flags(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add one flag per named setting; its value lands in ``args.<setting name>`` (None if not given)."""
    for name in names:
        info = Settings.model_fields[name]
        extra = _extra(info)
        kind = _base_type(info.annotation)
        options: dict[str, Any] = {"dest": name, "default": None, "help": _help(info)}
        if kind is bool:
            options["action"] = "store_true"
        elif kind is list:
            parse = extra.get("parse", "csv")
            if parse == "append":
                options["action"] = "append"
            else:
                converter: Callable[[str], list[str]] = shlex.split if parse == "shlex" else _csv
                options["type"] = converter
        elif extra.get("parse") in ("count", "count_or_auto"):  # vLLM's forms: 32k, 4G, auto
            options["type"] = parse_count_or_auto if extra["parse"] == "count_or_auto" else parse_count
        else:
            options["type"] = kind if kind in (int, float, Path) else str
        if "choices" in extra:
            options["choices"] = extra["choices"]
        parser.add_argument(*flag_names(name), **options)


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The settings the user typed (for :func:`~gateway.core.settings.load_settings`)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _shown_default(name: str) -> str:
    info = Settings.model_fields[name]
    shown = _extra(info).get("shown_default")
    if shown is None:
        default = info.get_default(call_default_factory=True)
        if default is None:
            return "unset"
        shown = "none" if default == [] else str(default).lower() if isinstance(default, bool) else default
    return f"`{shown}`"


def settings_table() -> str:
    """The README's configuration table, generated from the declarations (a test keeps them equal)."""
    rows = ["| setting | flag | default | meaning |", "|---|---|---|---|"]
    for name in SETTING_NAMES:
        info = Settings.model_fields[name]
        flags = ", ".join(f"`{flag}`" for flag in flag_names(name))
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{name}` | {flags} | {_shown_default(name)} | {meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(settings_table())
