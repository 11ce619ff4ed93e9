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
from gateway.catalog import ModelEntry
from gateway.errors import GatewayError
from gateway.hardware import Inventory
from gateway.policy import Policy

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

    @property
    def candidates(self) -> list[Candidate]:
        return [c for engine in self.engines for c in engine.candidates]

    @property
    def chosen(self) -> Candidate | None:
        return None if self.decision_index is None else self.candidates[self.decision_index]

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
            },
            "engine_version": self.versions(),
            "inventory": {
                "source": self.inventory.source,
                "gpus": [
                    {
                        "index": g.index,
                        "name": g.name,
                        "total_gib": round(g.total_bytes / 1024**3, 2),
                        "free_gib": round(g.free_bytes / 1024**3, 2),
                        "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                    }
                    for g in self.inventory.gpus
                ],
                "ram_available_gib": round(self.inventory.ram_available_bytes / 1024**3, 2),
            },
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
        notes += engine.model.notes if engine.model is not None else []
    passed_over: list[str] = []
    offset = 0
    for engine in engines:
        if (best := engine.best) is not None:
            reason = "; ".join([*passed_over, f"{best.label}: {best.reason}"])
            index = offset + engine.candidates.index(best)
            return Plan(name, inventory, policy, engines, engine.backend.name, index, reason, notes)
        title = engine.backend.title
        passed_over.append(f"no {title} rung fits" if engine.candidates else f"{title} not planned")
        offset += len(engine.candidates)
    reasons = [c.reason for engine in engines for c in engine.candidates[:2]]
    reason = "nothing fits: " + ("; ".join(reasons) or "no engine could be planned")
    return Plan(name, inventory, policy, engines, None, None, reason, notes)
