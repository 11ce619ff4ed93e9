"""The fit planner: model + machine + policy in, every engine's candidates with reasons out, one chosen.

Each registered backend reads the model its own way, evaluates its ladder and ranks it by the one
objective (``gateway/backends/objective.py``). The engine: the first in the registry's order of preference
whose best candidate meets the context floor without CPU offload (one whose agent turns stay warm
before one that prefills thousands of tokens again every turn); otherwise the best of every
engine's best by the same objective (a candidate below the floor is a last resort, and the decision
says so). Pure apart from :func:`read_engines`, which reads the model's facts (catalog, local files, hub).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gateway.backends import objective, registry
from gateway.backends.base import Backend, Candidate, Evaluation, Installation, ModelFiles
from gateway.backends.objective import Traits
from gateway.core.devices import Device, Inventory
from gateway.core.errors import GatewayError
from gateway.core.model_entry import ModelEntry
from gateway.core.policy import AGENT_PROMPT_TOKENS, Policy

log = logging.getLogger("gateway.planner")


@dataclass
class EnginePlan:
    """One engine's view of the model, its installation, and its candidates (fitting or not)."""

    backend: Backend[Any, Any, Any, BaseModel]
    installation: Installation
    model: ModelFiles | None  # None: the catalog entry has no table for this engine
    # what the engine's candidates() found (empty until evaluated); its options() takes it back
    evaluation: Evaluation[Any] = field(default_factory=Evaluation)

    @property
    def candidates(self) -> list[Any]:
        return self.evaluation.candidates

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
    # the other engines' best fitting candidate: what `serve` starts when the chosen engine fails to
    # start, or instead of it where that engine is not installed
    fallback_index: int | None = None
    why: str = ""  # one line: what the decision reaches and what the next best would give up
    # one engine or several replicas, as weighed (gateway/planning/replicas.py); None: only one engine can be
    # planned here (one GPU, none, or nothing fits)
    replication: Replication | None = None

    @property
    def last_resort(self) -> bool:
        """Nothing reaches the context floor: the decision is below it."""
        chosen = self.chosen
        return chosen is not None and chosen.traits.below_floor

    @property
    def candidates(self) -> list[Candidate]:
        return [c for engine in self.engines for c in engine.candidates]

    @property
    def chosen(self) -> Candidate | None:
        return None if self.decision_index is None else self.candidates[self.decision_index]

    @property
    def fallback(self) -> Candidate | None:
        return None if self.fallback_index is None else self.candidates[self.fallback_index]

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The engines to start, each with its own plan, devices and environment: the chosen shape's
        replicas, else this plan's decision as the one engine (empty when nothing fits)."""
        if self.replication is not None:
            return self.replication.chosen.engines
        chosen = self.chosen
        if chosen is None:
            return ()
        return (Replica(0, "", chosen.devices, self, {}, self.policy.sessions),)

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

    def sessions(self) -> dict[str, Any] | None:
        """How many agent sessions the decision runs at once and keeps warm, against the number asked for
        (--sessions): at its full context and at an agent's typical prompt."""
        chosen = self.chosen
        if chosen is None:
            return None
        goal = self.policy.goal
        full, typical = goal.warm_sessions(chosen.warm_tokens, chosen.context_length)
        return {
            "asked": goal.sessions,
            "at_once": chosen.at_once,
            "warm_tokens": chosen.warm_tokens,
            "warm_at_context": full,
            "context": chosen.context_length,
            "warm_at_typical_prompt": typical,
            "typical_prompt": min(chosen.context_length, AGENT_PROMPT_TOKENS),
        }

    def sessions_line(self) -> str | None:
        """The plan's one line on sessions: "sessions: 4 asked; 4 at once, 3 kept warm at 131,072 tokens
        (12 at 32,768)", and what happens past that."""
        sessions = self.sessions()
        if sessions is None:
            return None
        line = (
            f"sessions: {sessions['asked']} asked; {sessions['at_once']} at once, {sessions['warm_at_context']} kept "
            f"warm at {sessions['context']:,} tokens ({sessions['warm_at_typical_prompt']} at "
            f"{sessions['typical_prompt']:,})"
        )
        if sessions["asked"] > sessions["warm_at_typical_prompt"]:
            line += "; more than that and the least recently used sessions prefill again"
        if sessions["asked"] > sessions["at_once"]:
            line += "; more requests than run at once wait in the gateway's queue (warm turns first)"
        return line

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "decision": {
                "backend": self.decision_backend,
                "candidate": self.decision_index,
                "reason": self.decision_reason,
                "why": self.why,
                "last_resort": self.last_resort,
                "fallback": None
                if (fallback := self.fallback) is None
                else {
                    "backend": fallback.engine,
                    "candidate": self.fallback_index,
                    "label": fallback.label,
                    "reason": fallback.reason,
                },
                "installed": not self.not_installed(self.decision_backend),
                # the chosen candidate's sampling in one line (its "sampling" object has the figures)
                "sampling": None if (chosen := self.chosen) is None else chosen.sampling_line,
            },
            "engine_version": self.versions(),
            "inventory": self.inventory.to_json(),
            "policy": {
                "min_context": self.policy.min_context,
                "target_context": self.policy.goal.target,
                "max_context": self.policy.max_context,
                "hard_floor": self.policy.hard_floor,
            },
            "candidates": [c.to_json() for c in self.candidates],
            "notes": self.notes,
            "sessions": self.sessions(),
            # only where replicas are planned or were asked for: a plan of one engine keeps its JSON as it was
            **({"replicas": self.replication.to_json()} if self.replication and self.replication.shown else {}),
        }


@dataclass(frozen=True)
class Replica:
    """One engine of a shape, as the runtime starts it: where it runs (a node, some of its GPUs), its own
    plan on those GPUs alone (``serve_plan.options_of(replica.plan, settings)``: what to try, best first;
    ``replica.plan.chosen``: its decision), and the environment that keeps it on them."""

    index: int
    node: str  # "" this machine; else the worker node's name
    devices: tuple[Device, ...]  # its GPUs as that node numbers them (their labels: "2", "node2/0")
    plan: Plan
    env: dict[str, str]  # added to its engine's environment: the backend's words for its GPUs alone
    sessions: int  # the agent sessions it is planned for: its share of --sessions
    # a data-parallel group started as this one engine (vLLM's, of a MoE): its ranks, each planned as ``plan``
    # on an equal share of ``devices``; 1: an engine of its own
    ranks: int = 1

    @property
    def chosen(self) -> Candidate:
        chosen = self.plan.chosen
        assert chosen is not None, "a replica is planned only where its devices hold the model"
        return chosen

    @property
    def argv(self) -> list[str]:
        return list(self.chosen.argv)

    @property
    def warm(self) -> int:
        """Sessions it keeps warm at an agent's typical prompt (every rank's cache, in a group)."""
        return self.ranks * self.plan.policy.goal.warm_sessions(self.chosen.warm_tokens, self.chosen.context_length)[1]

    @property
    def at_once(self) -> int:
        return self.ranks * self.chosen.at_once

    @property
    def decode(self) -> float:
        """Estimated tokens/s of its sessions decoding at once (at most what it runs at once; a group's spread
        evenly over its ranks)."""
        shares = [self.sessions // self.ranks + (1 if i < self.sessions % self.ranks else 0) for i in range(self.ranks)]
        return sum(self.chosen.decode_rate(min(share, self.chosen.at_once)) for share in shares if share)

    def to_json(self) -> dict[str, Any]:
        """What the runtime (and a person) needs to start it: where, the engine's argv with PORT and KEY
        placeholders, its environment (the device pinning first), context, sessions, and every figure."""
        chosen = self.chosen
        return {
            "index": self.index,
            "node": self.node,
            "devices": [d.label for d in self.devices],
            "backend": chosen.engine,
            "label": chosen.label,
            "headline": chosen.headline,
            "context_length": chosen.context_length,
            "at_once": self.at_once,
            **({"ranks": self.ranks} if self.ranks > 1 else {}),
            "sessions": self.sessions,
            "warm_at_typical_prompt": self.warm,
            "decode_tokens_per_s": round(self.decode, 1),
            "env": {**self.env, **chosen.env},
            "argv": self.argv,
            "candidate": chosen.to_json(),
        }


@dataclass(frozen=True)
class Shape:
    """One way to run the model on this machine (one engine, or several replicas) with the figures the
    choice between them weighs (gateway/planning/replicas.py)."""

    replicas: tuple[Replica, ...]
    sessions: int  # asked for (--sessions), over all of them

    @property
    def count(self) -> int:
        return len(self.replicas)

    @property
    def grouped(self) -> bool:
        """Its replicas are ranks of one engine group: they step together and share one fate."""
        return any(r.chosen.ranks > 1 for r in self.replicas)

    @property
    def engines(self) -> tuple[Replica, ...]:
        """What `serve` starts: each replica, or a group's ranks as ONE engine over all their GPUs (vLLM's
        data parallelism: one `vllm serve` with the group's flags, one fate; the router still places each
        session on a rank, gateway.cli.startup)."""
        if not self.grouped:
            return self.replicas
        first = self.replicas[0]
        devices = tuple(d for r in self.replicas for d in r.devices)
        engine = first.plan.engine(first.chosen.engine)
        env = engine.backend.device_env(devices) if engine is not None else {}
        return (Replica(0, first.node, devices, first.plan, env, self.sessions, ranks=self.count),)

    @property
    def warm(self) -> int:
        """Sessions kept warm at an agent's typical prompt, all replicas together."""
        return sum(r.warm for r in self.replicas)

    @property
    def at_once(self) -> int:
        return sum(r.chosen.at_once for r in self.replicas)

    @property
    def decode(self) -> float:
        """Estimated tokens/s of the sessions asked for decoding at once, all replicas together."""
        return sum(r.decode for r in self.replicas)

    @property
    def context(self) -> int:
        return min(r.chosen.context_length for r in self.replicas)

    @property
    def traits(self) -> Traits:
        """The worst replica's, by the one objective (every session must be served as well as that one)."""
        return objective.ranked([r.chosen.traits for r in self.replicas], lambda t: t)[-1]

    def figures(self) -> dict[str, Any]:
        """What the choice weighs, and where each engine runs."""
        return {
            "engines": len(self.engines),
            "group": self.grouped,
            **({"ranks": self.count} if self.grouped else {}),
            "where": [{"node": r.node, "devices": [d.label for d in r.devices]} for r in self.replicas],
            "context_length": self.context,
            "at_once": self.at_once,
            "warm_at_typical_prompt": self.warm,
            "decode_tokens_per_s": round(self.decode, 1),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.figures(), "replicas": [r.to_json() for r in self.engines]}


@dataclass(frozen=True)
class Replication:
    """The shape chosen for the machine, the best of the other kind beside it, and why."""

    chosen: Shape
    other: Shape | None  # the best shape of the other kind (one engine, or replicas); None: none planned
    # one engine over every node, where ``one engine`` above leaves nodes idle (vLLM's stages across nodes):
    # what pooling would give, shown beside the choice; never started instead of it
    pooled: Shape | None
    asked: int | None  # --replicas; None: auto
    why: str
    weighed: tuple[Shape, ...] = ()  # the other layouts of replicas weighed, best first
    why_not: str = ""  # replicas chosen: why not the runner-up layout of replicas (the first of ``weighed``)

    @property
    def shown(self) -> bool:
        """Whether the plan's JSON carries it: replicas are planned, or the user asked for a number."""
        return self.chosen.count > 1 or self.asked is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "asked": "auto" if self.asked is None else self.asked,
            "why": self.why,
            **({"why_not": self.why_not} if self.why_not else {}),
            **self.chosen.to_json(),
            "other": None if self.other is None else self.other.to_json(),
            "pooled": None if self.pooled is None else self.pooled.to_json(),
            "weighed": [shape.figures() for shape in self.weighed],
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


def evaluate_and_choose(name: str, engines: list[EnginePlan], inventory: Inventory, policy: Policy) -> Plan:
    """Evaluate every engine's ladder (into ``engines``) and choose the first engine's best fitting
    candidate (pure otherwise)."""
    notes = list(inventory.notes)
    for engine in engines:
        if engine.model is not None and policy.plans(engine.backend.name):
            engine.evaluation = engine.backend.candidates(engine.model, inventory, policy, engine.installation)
        if engine.model is not None:
            found = [*engine.model.notes, *engine.evaluation.notes]
            notes += [note for note in found if note not in notes]
        elif policy.plans(engine.backend.name):
            notes.append(f"{engine.backend.title} not planned: {_needs(engine.backend)}")
    bests = [(engine, engine.best) for engine in engines]
    offered = [(engine, best) for engine, best in bests if best is not None]
    if offered:
        steady = [(e, b) for e, b in offered if not b.traits.below_floor and not b.traits.offload]
        # of those, one whose later turns stay warm before one that prefills thousands of tokens again
        warm = [(e, b) for e, b in steady if not b.traits.cold_turns]
        engine, best = (warm or steady)[0] if steady else objective.ranked(offered, lambda pair: pair[1].traits)[0]
        passed_over = [_passed_over(e, b, best) for e, b in bests if e is not engine and b is not best]
        reason = "; ".join([*passed_over, f"{best.label}: {best.reason}"])
        others = [(e, b) for e, b in offered if e is not engine]
        runner_up = objective.ranked(others, lambda pair: pair[1].traits)[0] if others else None
        plan = Plan(name, inventory, policy, engines, engine.backend.name, _index(engines, best), reason, notes)
        plan.fallback_index = _index(engines, runner_up[1]) if runner_up else None
        unfit = [f"no {e.backend.title} rung fits" for e, b in bests if b is None and e.candidates]
        plan.why = "; ".join([_why(engine, best, runner_up, bool(inventory.gpus)), *unfit])
        return plan
    # one reason per engine: its ladder's rungs fail alike, and the notes say what was not planned
    reasons = [engine.candidates[0].reason for engine in engines if engine.candidates]
    reasons += [note for note in notes if " not planned: " in note]
    if any(engine.candidates for engine in engines):
        reasons.append(QUANTIZED_HINT)
    reason = "nothing fits: " + ("; ".join(reasons) or "no engine could be planned")
    return Plan(name, inventory, policy, engines, None, None, reason, notes)


def _index(engines: list[EnginePlan], candidate: Candidate) -> int:
    """The candidate's index among every engine's candidates (the JSON's and the plan's numbering)."""
    offset = 0
    for engine in engines:
        if any(c is candidate for c in engine.candidates):
            return offset + next(i for i, c in enumerate(engine.candidates) if c is candidate)
        offset += len(engine.candidates)
    raise ValueError("not a candidate of these engines")


def _passed_over(engine: EnginePlan, best: Candidate | None, chosen: Candidate) -> str:
    """Why an engine before or after the chosen one is not the decision, in a few words."""
    title = engine.backend.title
    if best is None:
        return f"no {title} rung fits" if engine.candidates else f"{title} not planned"
    lost = [s for s in best.traits.shortfalls() if s not in chosen.traits.shortfalls()]
    return f"{title}'s best gives up " + (", ".join(lost) if lost else "more than the chosen one")


def _why(engine: EnginePlan, best: Candidate, runner_up: tuple[EnginePlan, Candidate] | None, gpus: bool = True) -> str:
    """The decision's one line of why: the engine rule, what it reaches, what the other engine lacks."""
    traits = best.traits
    if traits.below_floor:
        rule = f"LAST RESORT: nothing reaches the {traits.goal.floor:,}-token floor"
    elif not traits.offload and runner_up is not None and runner_up[1].traits.cold_turns and not traits.cold_turns:
        rule = (
            f"{engine.backend.title} meets the floor and keeps agent turns warm "
            f"({runner_up[0].backend.title}'s best does not)"
        )
    elif not traits.offload and (runner_up is None or _before(engine, runner_up[0])):
        rule = f"{engine.backend.title} meets the floor" + (" without offload" if gpus else " on the CPU")
    elif not traits.offload:
        rule = f"{engine.backend.title} meets the floor without offload and the engines before it do not"
    else:
        rule = "no engine meets the floor without offload: the best by the objective"
    line = objective.why(traits)
    fitting = [c for c in engine.candidates if c.fits and c is not best]
    finer = [c for c in objective.ranked(fitting, lambda c: c.traits) if c.traits.weight_bits > traits.weight_bits]
    if finer and (lost := objective.lost_on(traits, finer[0].traits)):
        finest = finer[0]
        line += f"; {finest.headline.split(', ', 1)[0]} ({finest.label}, context {finest.context_length:,}): {lost}"
    if runner_up is not None:
        other, candidate = runner_up
        missing = [s for s in candidate.traits.shortfalls() if s not in traits.shortfalls()]
        if missing:
            line += f"; {other.backend.title}'s best: " + ", ".join(missing)
    return f"{rule}: {line}"


def _before(engine: EnginePlan, other: EnginePlan) -> bool:
    """``engine`` comes before ``other`` in the registry's order of preference."""
    names = registry.names()
    return names.index(engine.backend.name) < names.index(other.backend.name)


QUANTIZED_HINT = (
    "a quantized checkpoint (4-bit weights take about a third of BF16's memory) may fit: pass one with "
    "--model (a quantized model file, or a pre-quantized hub repo) or add it to the catalog"
)


def _needs(backend: Backend[Any, Any, Any, BaseModel]) -> str:
    """What the engine needs to be planned, in its own words when it says (``needs``)."""
    return backend.needs or f"the model has no [{backend.name}] source in the catalog"
