"""Configurations that started, remembered per (model, GPU fingerprint) with the engine and version.

One JSON file in the state directory, replaced atomically (write a temp file, then rename) so a
crash never leaves it half-written. An entry is used only when the engine version still matches.
Every gateway of the machine with that state directory shares the file: each reading and rewriting of
it holds the store's lock (:func:`gateway.core.files.exclusive`), else two gateways recording at once
each wrote back what they had read and one record was lost.

The file is read as input that may have gone bad (hand-edited, written by another version, a disk
error): a file that is not a JSON object is renamed aside (``known-good.json.bad-<time>``), and an entry
of the wrong shape, or one that no longer resolves (:meth:`KnownGood.set_aside`, e.g. its hub repo is
gone), is moved to ``known-good.set-aside.json``; either way with a warning, and the plan is made afresh,
as ``--replan`` would. Nothing is deleted: what was remembered can be looked at and put back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gateway.core.files import exclusive, read_regular_file, replace_atomically

log = logging.getLogger("gateway.state")

FILE_NAME = "known-good.json"
SET_ASIDE_NAME = "known-good.set-aside.json"
LOCK_NAME = "known-good.json.lock"
MAX_FILE_BYTES = 16 * 1024 * 1024  # an entry is a few hundred bytes
LOCK_WAIT_S = 10.0  # another gateway holds the store for milliseconds; past this it is stuck (an OSError)

_Figure = Annotated[float, Field(ge=0, allow_inf_nan=False)] | None


class _Measured(BaseModel):
    """The engine's own timings stored with an entry (the figures the plan and the status page read)."""

    model_config = ConfigDict(extra="allow")
    decode_tokens_per_s: _Figure = None
    prompt_tokens_per_s: _Figure = None
    estimated_decode_tokens_per_s: _Figure = None
    draft_acceptance: _Figure = None
    when: StrictStr | None = None


class _Entry(BaseModel):
    """One remembered configuration; its memo is the engine's own (each engine checks it when rebuilding)."""

    model_config = ConfigDict(extra="allow")
    engine: StrictStr
    version: StrictStr
    memo: dict[str, Any]
    when: StrictStr | None = None
    measured: _Measured | None = None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the entry"
    return f"{where}: {first['msg']}"


class KnownGood:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self.set_aside_path = state_dir / SET_ASIDE_NAME
        self.lock_path = state_dir / LOCK_NAME

    def _held(self) -> contextlib.AbstractContextManager[None]:
        """The store to this process alone, for one read, or one read and its rewrite."""
        return exclusive(self.lock_path, wait_s=LOCK_WAIT_S)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(read_regular_file(self.path, MAX_FILE_BYTES))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("ignoring unreadable %s (%s)", self.path, exc.strerror)
            return {}
        except (ValueError, RecursionError) as exc:
            return self._file_aside(f"not JSON: {str(exc)[:120] or type(exc).__name__}")
        return data if isinstance(data, dict) else self._file_aside(f"a JSON {type(data).__name__}, not an object")

    def _file_aside(self, why: str) -> dict[str, Any]:
        """Rename the whole file aside (it cannot be read entry by entry); what is remembered starts empty."""
        aside = self.path.with_name(f"{self.path.name}.bad-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
        try:
            self.path.replace(aside)
        except OSError as exc:
            log.warning("ignoring the remembered configurations in %s (%s; cannot rename it aside: %s): planning "
                        "afresh, as --replan would", self.path, why, exc.strerror)  # fmt: skip
            return {}
        log.warning("ignoring the remembered configurations in %s (%s): renamed to %s; planning afresh, as --replan "
                    "would", self.path, why, aside.name)  # fmt: skip
        return {}

    @staticmethod
    def key(model: str, fingerprint: str) -> str:
        return f"{model}|{fingerprint}"

    def get(self, model: str, fingerprint: str) -> dict[str, Any] | None:
        """The remembered entry, checked: one of the wrong shape is set aside (None); so is nothing when
        another process holds the store past ``LOCK_WAIT_S`` (with a warning: planned afresh)."""
        try:
            with self._held():
                entry = self._load().get(self.key(model, fingerprint))
                if entry is None:
                    return None
                try:
                    checked = _Entry.model_validate(entry)
                except ValidationError as exc:
                    self._set_aside(model, fingerprint, f"malformed ({_first_error(exc)})")
                    return None
                return checked.model_dump(exclude_unset=True)
        except OSError as exc:
            log.warning("cannot read the remembered configurations (%s): planning afresh", exc)
            return None

    def set_aside(self, model: str, fingerprint: str, why: str) -> None:
        """Move the entry out of the file into the set-aside file, with why and when, and say so."""
        try:
            with self._held():
                self._set_aside(model, fingerprint, why)
        except OSError as exc:  # the lock: the entry stays, and this plan does not use it
            log.warning("ignoring the remembered configuration for %s (%s; cannot set it aside: %s): planning "
                        "afresh, as --replan would", model, why, exc)  # fmt: skip

    def _set_aside(self, model: str, fingerprint: str, why: str) -> None:
        key = self.key(model, fingerprint)
        data = self._load()
        if key not in data:
            return
        aside = self._set_aside_entries()
        aside[f"{key}@{_now()}"] = {"entry": data.pop(key), "why": why}
        try:
            replace_atomically(self.set_aside_path, json.dumps(aside, indent=2))
            replace_atomically(self.path, json.dumps(data, indent=2))
        except OSError as exc:
            log.warning("ignoring the remembered configuration for %s (%s; cannot set it aside: %s): planning "
                        "afresh, as --replan would", model, why, exc.strerror)  # fmt: skip
            return
        log.warning("ignoring the remembered configuration for %s (%s): set aside in %s; planning afresh, as "
                    "--replan would", model, why, self.set_aside_path)  # fmt: skip

    def _set_aside_entries(self) -> dict[str, Any]:
        """What was set aside before; a set-aside file that cannot be read is itself renamed aside."""
        try:
            data = json.loads(read_regular_file(self.set_aside_path, MAX_FILE_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError):
            data = None
        if isinstance(data, dict):
            return data
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        with contextlib.suppress(OSError):
            self.set_aside_path.replace(self.set_aside_path.with_name(f"{self.set_aside_path.name}.bad-{stamp}"))
        return {}

    def put(self, model: str, fingerprint: str, engine: str, version: str, memo: dict[str, Any]) -> None:
        """Remember a configuration that started (an OSError when the file cannot be written)."""
        with self._held():
            data = self._load()
            data[self.key(model, fingerprint)] = {"engine": engine, "version": version, "memo": memo, "when": _now()}
            replace_atomically(self.path, json.dumps(data, indent=2))

    def record_measured(
        self, model: str, fingerprint: str, engine: str, memo: dict[str, Any], measured: dict[str, float]
    ) -> bool:
        """Store the engine's own timings with the remembered configuration they were measured on
        (only if it still is the remembered one); True when written."""
        with self._held():
            data = self._load()
            entry = data.get(self.key(model, fingerprint))
            if not isinstance(entry, dict) or entry.get("engine") != engine or entry.get("memo") != memo:
                return False
            if entry.get("measured") == measured:
                return False
            entry["measured"] = {**measured, "when": _now()}
            replace_atomically(self.path, json.dumps(data, indent=2))
            return True


@dataclass(frozen=True)
class KnownGoodSlot:
    """One model on one machine's place in the store (``model``, the machine's ``fingerprint``), and the
    version of each engine that a configuration which starts now is remembered for."""

    store: KnownGood
    model: str
    fingerprint: str
    versions: dict[str, str]  # engine → version string
