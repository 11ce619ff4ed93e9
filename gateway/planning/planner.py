"""The fit planner: model + machine + policy in, every engine's candidates with reasons out, one chosen.

Each registered backend reads the model its own way and evaluates its ladder; the first engine (in
the registry's order of preference) with a fitting candidate is chosen, its best candidate first.
Pure apart from :func:`read_engines`, which reads the model's facts (catalog, local files, hub).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from backends import registry
from backends.base import Backend, Candidate, Installation, ModelFiles
from gateway.core.devices import Inventory
from gateway.core.errors import GatewayError
from gateway.core.model_entry import ModelEntry
from gateway.core.policy import Policy

log = logging.getLogger("gateway.planner")


@dataclass
class EnginePlan:
    """One engine's view of the model, its installation, and its candidates (fitting or not)."""

    backend: Backend[Any, Any]
    installation: Installation
    model: ModelFiles | None  # None: the catalog entry has no table for this engine
    candidates: list[Any] = field(default_factory=list)

    @property
    def best(self) -> Candidate | None:
        ranked = self.backend.ranked(self.candidates)
        return ranked[0] if ranked else None


@dataclass
class Plan:
    model: str
    inventory: Inventory
    policy: Policy
    engines: list[EnginePlan]
    decision_backend: str | None
    decision_index: int | None
    decision_reason: str
    notes: list[str]
    # the next engine's best fitting candidate: what `serve` starts when the chosen engine fails to
    # start, or instead of it where that engine is not installed
    fallback_index: int | None = None

    @property
    def candidates(self) -> list[Candidate]:
        return [c for engine in self.engines for c in engine.candidates]

    @property
    def chosen(self) -> Candidate | None:
        return None if self.decision_index is None else self.candidates[self.decision_index]

    @property
    def fallback(self) -> Candidate | None:
        return None if self.fallback_index is None else self.candidates[self.fallback_index]

    def not_installed(self, name: str | None) -> bool:
        """The engine was planned from an assumed version: `serve` here would skip it."""
        engine = self.engine(name) if name else None
        return engine is not None and engine.installation.command is None

    def engine(self, name: str) -> EnginePlan | None:
        return next((e for e in self.engines if e.backend.name == name), None)

    def candidates_of(self, name: str) -> list[Any]:
        engine = self.engine(name)
        return engine.candidates if engine else []

    def versions(self) -> str:
        """The engine versions the plan was made for ("vllm 0.32.0 (installed)")."""
        return "; ".join(
            f"{e.backend.name} {e.installation.version} ({e.installation.version_source})" for e in self.engines
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "decision": {
                "backend": self.decision_backend,
                "candidate": self.decision_index,
                "reason": self.decision_reason,
                "fallback": None
                if (fallback := self.fallback) is None
                else {
                    "backend": fallback.engine,
                    "candidate": self.fallback_index,
                    "label": fallback.label,
                    "reason": fallback.reason,
                },
                "installed": not self.not_installed(self.decision_backend),
            },
            "engine_version": self.versions(),
            "inventory": self.inventory.to_json(),
            "policy": {"min_context": self.policy.min_context, "max_context": self.policy.max_context},
            "candidates": [c.to_json() for c in self.candidates],
            "notes": self.notes,
        }


def read_engines(entry: ModelEntry, installations: dict[str, Installation]) -> list[EnginePlan]:
    """Every registered engine, in order; those with a table in the entry read the model (I/O: files,
    a package, the hub)."""
    engines = []
    for backend in registry.BACKENDS:
        model = None
        if entry.source(backend.name) is not None:
            try:
                model = backend.read(entry)
            except (OSError, ValueError) as exc:
                raise GatewayError(f"cannot read the facts of {entry.name}: {exc}") from exc
        engines.append(EnginePlan(backend, installations[backend.name], model))
    return engines


def decide(name: str, engines: list[EnginePlan], inventory: Inventory, policy: Policy) -> Plan:
    """Evaluate every engine's ladder and choose the first engine's best fitting candidate (pure)."""
    notes = list(inventory.notes)
    for engine in engines:
        if engine.model is not None and policy.plans(engine.backend.name):
            engine.candidates = engine.backend.candidates(engine.model, inventory, policy, engine.installation)
        if engine.model is not None:
            notes += [note for note in engine.model.notes if note not in notes]
        elif policy.plans(engine.backend.name):
            notes.append(f"{engine.backend.title} not planned: {_needs(engine.backend)}")
    passed_over: list[str] = []
    offset = 0
    for number, engine in enumerate(engines):
        if (best := engine.best) is not None:
            reason = "; ".join([*passed_over, f"{best.label}: {best.reason}"])
            index = offset + engine.candidates.index(best)
            plan = Plan(name, inventory, policy, engines, engine.backend.name, index, reason, notes)
            plan.fallback_index = _fallback(engines, number, offset + len(engine.candidates))
            return plan
        title = engine.backend.title
        passed_over.append(f"no {title} rung fits" if engine.candidates else f"{title} not planned")
        offset += len(engine.candidates)
    # one reason per engine: its ladder's rungs fail alike, and the notes say what was not planned
    reasons = [engine.candidates[0].reason for engine in engines if engine.candidates]
    reasons += [note for note in notes if " not planned: " in note]
    if any(engine.candidates for engine in engines):
        reasons.append(QUANTIZED_HINT)
    reason = "nothing fits: " + ("; ".join(reasons) or "no engine could be planned")
    return Plan(name, inventory, policy, engines, None, None, reason, notes)


def _fallback(engines: list[EnginePlan], chosen: int, offset: int) -> int | None:
    """The index of the first later engine's best fitting candidate, if any."""
    for engine in engines[chosen + 1 :]:
        if (best := engine.best) is not None:
            return offset + engine.candidates.index(best)
        offset += len(engine.candidates)
    return None


QUANTIZED_HINT = (
    "a quantized checkpoint (4-bit weights take about a third of BF16's memory) may fit: pass one with "
    "--model (a quantized model file, or a pre-quantized hub repo) or add it to the catalog"
)


def _needs(backend: Backend[Any, Any]) -> str:
    """What the engine needs to be planned, in its own words when it says (``needs``)."""
    return str(getattr(backend, "needs", None) or f"the model has no [{backend.name}] source in the catalog")
