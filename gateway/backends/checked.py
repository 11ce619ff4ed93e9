"""Numbers and JSON read from files someone else wrote (a GGUF header, config.json, a safetensors index),
checked before they size anything: a count outside what any real model has, a zero divisor, a float
where an integer belongs, JSON that is not an object or nests past what a config ever does — each is
one line naming the file, the field and the value, rather than a crash, a hang or a nonsense plan."""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.core.errors import ModelError, shown

MAX_JSON_BYTES = 64 << 20  # a config.json or an index is kilobytes to a few megabytes
MAX_DEPTH = 64  # configs nest a handful of levels (text_config, quantization_config.config_groups...)


def integer(value: Any, where: str, field: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``: an int, or a float that is a whole number (JSON may
    write 4096.0); anything else raises ModelError naming ``where``, ``field`` and the value."""
    whole = (
        value
        if isinstance(value, int) and not isinstance(value, bool)
        else int(value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer()
        else None
    )
    if whole is None or not low <= whole <= high:
        raise ModelError(f"{where}: {field} = {shown(value)} is out of range (a whole number from {low:,} to {high:,})")
    return whole


def _depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests, counting no further than ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        if isinstance(item, dict):
            stack += [(child, depth + 1) for child in item.values()]
        elif isinstance(item, list):
            stack += [(child, depth + 1) for child in item]
    return deepest


def json_object(text: str | bytes, where: str) -> dict[str, Any]:
    """A JSON object from ``text`` (config.json, an index): too large, not JSON, nested deeper than any
    real one (Python's parser would recurse until it fails) or not an object raises ModelError."""
    if len(text) > MAX_JSON_BYTES:
        raise ModelError(f"{where}: {len(text):,} bytes, more than any config ({MAX_JSON_BYTES >> 20} MiB): refused")
    try:
        found = json.loads(text)
    except RecursionError:
        raise ModelError(f"{where}: JSON nested deeper than Python can parse: refused") from None
    except ValueError as exc:
        raise ModelError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(found, dict):
        raise ModelError(f"{where}: a JSON {type(found).__name__} where an object belongs")
    if _depth(found, MAX_DEPTH) > MAX_DEPTH:
        raise ModelError(f"{where}: JSON nested more than {MAX_DEPTH} levels deep: refused")
    return found
