"""JSON read so that writing it back means the same: Python's ``json`` accepts ``NaN``, ``Infinity`` and
numbers that overflow to infinity (``1e999``), then writes them as ``NaN``/``Infinity``, which is not JSON;
a key given twice silently keeps its last value. Request bodies the gateway re-encodes for the engine
and agent files ``gateway agent --write`` rewrites both refuse them with a ValueError that says why."""

from __future__ import annotations

import json
import math
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:40]} is out of range for a double (it would be written back as Infinity)")
    return number


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice (writing it back would keep only the last)")
        seen[key] = value
    return seen


def loads(text: str, *, unique_keys: bool = False) -> Any:
    """``json.loads`` refusing what would not survive the way back; ``unique_keys``: a repeated key too."""
    if unique_keys:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys)
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
