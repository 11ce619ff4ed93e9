"""Configurations that started, remembered per (model, GPU fingerprint) with the engine and version.

One JSON file in the state directory, replaced atomically (write a temp file, then rename) so a
crash never leaves it half-written. An entry is used only when the engine version still matches.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from gateway.files import replace_atomically

log = logging.getLogger("gateway.state")

FILE_NAME = "known-good.json"


class KnownGood:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s (%s)", self.path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def key(model: str, fingerprint: str) -> str:
        return f"{model}|{fingerprint}"

    def get(self, model: str, fingerprint: str) -> dict[str, Any] | None:
        entry = self._load().get(self.key(model, fingerprint))
        return entry if isinstance(entry, dict) else None

    def put(self, model: str, fingerprint: str, engine: str, version: str, memo: dict[str, Any]) -> None:
        data = self._load()
        data[self.key(model, fingerprint)] = {
            "engine": engine,
            "version": version,
            "memo": memo,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        replace_atomically(self.path, json.dumps(data, indent=2))

    def record_measured(
        self, model: str, fingerprint: str, engine: str, memo: dict[str, Any], measured: dict[str, float]
    ) -> bool:
        """Store the engine's own timings with the remembered configuration they were measured on
        (only if it still is the remembered one); True when written."""
        data = self._load()
        entry = data.get(self.key(model, fingerprint))
        if not isinstance(entry, dict) or entry.get("engine") != engine or entry.get("memo") != memo:
            return False
        if entry.get("measured") == measured:
            return False
        entry["measured"] = {**measured, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        replace_atomically(self.path, json.dumps(data, indent=2))
        return True
