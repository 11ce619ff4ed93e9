"""More than one engine: one engine over the machine's GPUs, or replicas of the model, each on GPUs that
hold it at the context floor on their own (one node's, or part of them: 2 of 4 GPUs with TP2), each agent
session kept on one replica (the router's job, not this module's).

Units. A replica runs on k GPUs of one node: k a power of two up to the node's count, or the node's whole
count; a layout takes every node's GPUs k at a time, in index order. Each unit is planned as a machine of
its own (:func:`~gateway.planning.planner.evaluate_and_choose` on those GPUs numbered from 0, as the
engine's process sees them through the backend's ``device_env``; this machine's RAM, since a worker does
not report its own; the sessions shared among the layout's units), so each replica has its own decision,
fallback and options, as the one engine has. A unit counts where its decision meets the floor without
weights in RAM; a layout needs two. Replicas that would differ (another engine, another context) are
planned again on the best one's engine and the shortest of their contexts: any session can go to any one.

Choice (README "More than one engine"). The one objective decides first, as it does between engines:
floor, fragile settings, warm turns, context up to the target, a crawl, precision
(:func:`gateway.backends.objective.standing`, of the worst replica). Then the sessions kept warm at an agent's
typical prompt, all replicas together, counted up to the sessions asked for (``--sessions``); then the
aggregate decode of those sessions at once (each engine's own estimate, ``Candidate.decode_rate``):
replicas must decode :data:`REPLICA_GAIN` times one engine's to be worth more engines than one.
``--replicas N`` decides instead (the best layout with N units); the other shape is still shown.

"One engine" is the plan's decision as it stands (what `serve` starts today). Where it leaves other nodes
idle and an engine can pool them (vLLM's pipeline stages across nodes), that pooled engine is planned too
and shown beside the choice, with the link it pays on every decode step; it is never started instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gateway.backends import objective, registry
from gateway.backends.base import Candidate
from gateway.core.devices import Device, Inventory
from gateway.core.errors import ConfigError
from gateway.core.policy import AGENT_PROMPT_TOKENS
from gateway.planning.planner import EnginePlan, Plan, Replica, Replication, Shape, evaluate_and_choose

# Replicas decode this many times one engine's tokens/s, or one engine it is: the figures are estimates,
# and every engine more is one more process to start, watch and restart
REPLICA_GAIN = 1.1
WARM_STEP = 0.1  # sessions kept warm count in steps of this share of the sessions asked for


@dataclass(frozen=True)
class Unit:
    """GPUs of one node that one replica would run on."""

    node: str  # "" this machine
    devices: tuple[Device, ...]

    @property
    def signature(self) -> tuple[tuple[str, int, int, tuple[int, int]], ...]:
        """What its plan depends on: two units of equal GPUs plan alike."""
        return tuple((d.name, d.total_bytes, d.free_bytes, d.compute_capability) for d in self.devices)


def layouts(inventory: Inventory) -> list[tuple[Unit, ...]]:
    """Every way to cut the nodes' GPUs into units of k GPUs of one node (k a power of two, or a node's
    whole count) that gives at least two units; this machine's units first."""
    nodes = {
        node: tuple(sorted((g for g in gpus if not g.is_cpu), key=lambda g: g.index))
        for node, gpus in inventory.nodes.items()
    }
    most = max((len(gpus) for gpus in nodes.values()), default=0)
    sizes = sorted({1 << i for i in range(most.bit_length()) if 1 << i <= most} | {len(g) for g in nodes.values() if g})
    found: list[tuple[Unit, ...]] = []
    for k in sizes:
        units = tuple(
            Unit(node, gpus[i * k : (i + 1) * k]) for node, gpus in nodes.items() for i in range(len(gpus) // k)
        )
        if len(units) >= 2 and units not in found:
            found.append(units)
    return found


def weigh(plan: Plan, asked: int | None) -> Replication | None:
    """One engine or replicas for ``plan``'s machine (``asked``: --replicas; None: auto). None where only one
    engine can be planned (nothing fits, or one GPU or none); raises ConfigError where ``asked`` replicas do
    not fit, naming how many do."""
    one = _one_engine(plan)
    cuts = layouts(plan.inventory)
    if one is None or not cuts:
        if asked is not None and asked > 1 and one is not None and not _has_gpus(plan):
            return _cpu_replicas(plan, one, asked)
        if asked is not None and asked > 1 and one is not None:
            raise ConfigError(f"--replicas {asked}: this machine has one GPU or none: pass --replicas 1 or auto")
        return None
    units = _UnitPlans(plan)
    alone = [shape for cut in cuts if (shape := units.shape(cut, asked)) is not None]
    groups = [group for cut in cuts if (group := units.group(cut, asked)) is not None]
    shapes = sorted([*alone, *_worth_a_group(groups, alone)], key=_rank)
    best, weighed = (shapes[0], tuple(shapes[1:])) if shapes else (None, ())
    pooled = _pooled(plan, one)
    if asked is not None and asked > 1:
        if best is None:
            raise ConfigError(_too_many(plan, asked, units.most))
        return Replication(best, one, pooled, asked, _as_asked(asked, best, one), weighed)
    if best is None:
        floor = plan.policy.goal.floor
        why = f"one engine: no GPUs of one node hold the model at the {floor:,}-token floor on their own"
        return Replication(one, None, pooled, asked, why)
    if asked == 1:
        return Replication(one, best, pooled, asked, _as_asked(asked, one, best), weighed)
    if plan.policy.pins.engine and one.replicas[0].chosen.nodes:  # the flags given pool the nodes: as asked
        why = "one engine: the engine flags given pool the nodes (--replicas 2 or more to weigh replicas)"
        return Replication(one, best, pooled, asked, why, weighed)
    if _replicas_win(best, one):
        return Replication(best, one, pooled, asked, _compare(best, one), weighed, _why_not(best, weighed))
    return Replication(one, best, pooled, asked, _compare(one, best), weighed)


class _UnitPlans:
    """Each unit's plan, made once per kind of unit, sessions and restriction (units of equal GPUs plan alike)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.made: dict[tuple[Any, ...], Plan] = {}
        self.most = 0  # the most units of one layout whose plans meet the floor

    def on(
        self,
        unit: Unit,
        sessions: int,
        engines: tuple[str, ...] | None = None,
        top: int | None = None,
        *,
        ranks: int = 1,
    ) -> Plan:
        key = (unit.signature, sessions, engines, top, ranks)
        if key not in self.made:
            whole = self.plan.inventory
            gpus = tuple(
                replace(d, index=i, node="", endpoint="", link="", rtt_ms=None) for i, d in enumerate(unit.devices)
            )
            machine = Inventory(gpus, whole.ram_total_bytes, whole.ram_available_bytes, source=whole.source)
            policy = replace(self.plan.policy, sessions=sessions, pool_nodes=False, data_parallel=ranks)
            if engines is not None:
                policy = replace(policy, engines=engines)
            if top is not None:
                policy = replace(policy, max_context=top)
            fresh = [EnginePlan(e.backend, e.installation, e.model) for e in self.plan.engines]
            self.made[key] = evaluate_and_choose(self.plan.model, fresh, machine, policy)
        return self.made[key]

    def shape(self, cut: tuple[Unit, ...], asked: int | None) -> Shape | None:
        """The replicas of one layout whose plans meet the floor (the first ``asked`` of them), made alike."""
        asked_sessions = self.plan.policy.sessions
        pinned = self.plan.policy.pins.engine and self.plan.decision_backend  # pinned engine flags: that engine alone
        engines = (self.plan.decision_backend,) if pinned and self.plan.decision_backend else None
        kept = [u for u in cut if _steady(self.on(u, _each(asked_sessions, len(cut)), engines))]
        self.most = max(self.most, len(kept))
        if asked is not None and asked > 1:
            kept = kept[:asked]
        if len(kept) < max(2, asked or 0):
            return None
        plans = [self.on(u, _each(asked_sessions, len(kept)), engines) for u in kept]
        decided = [p.chosen for p in plans if p.chosen is not None]
        if len({(c.engine, c.context_length) for c in decided}) > 1:  # alike: the best's engine, the shortest context
            lead = objective.ranked(decided, lambda c: c.traits)[0]
            top = min(c.context_length for c in decided)
            again = [(u, self.on(u, _each(asked_sessions, len(kept)), (lead.engine,), top)) for u in kept]
            kept = [u for u, p in again if _steady(p)]
            if len(kept) < max(2, asked or 0):
                return None
            plans = [p for _, p in again if _steady(p)]
        shares = _shares(asked_sessions, len(kept))
        replicas = tuple(
            Replica(i, u.node, u.devices, p, _device_env(p, u.devices), share)
            for i, (u, p, share) in enumerate(zip(kept, plans, shares, strict=True))
        )
        return Shape(replicas, asked_sessions)

    def group(self, cut: tuple[Unit, ...], asked: int | None) -> Shape | None:
        """The layout's units as the ranks of one engine group sharing the model (vLLM's data parallelism
        of a MoE), where the engine has one and every rank meets the floor; alike units of one node only:
        ranks sharing experts exchange every token twice per MoE layer, which over a network between
        nodes costs far more than the pipeline stages' two crossings per step."""
        ranks = len(cut)
        if len({u.signature for u in cut}) != 1 or len({u.node for u in cut}) != 1:
            return None
        if asked is not None and asked > 1 and asked != ranks:
            return None
        sessions = self.plan.policy.sessions
        plans = [self.on(u, _each(sessions, ranks), ranks=ranks) for u in cut]
        if not all(_steady(p) and p.chosen is not None and p.chosen.ranks == ranks for p in plans):
            return None
        replicas = tuple(
            Replica(i, u.node, u.devices, p, _device_env(p, u.devices), share)
            for i, (u, p, share) in enumerate(zip(cut, plans, _shares(sessions, ranks), strict=True))
        )
        return Shape(replicas, sessions)


def _worth_a_group(groups: list[Shape], alone: list[Shape]) -> list[Shape]:
    """The groups that meet the floor, or keep more sessions warm, where replicas of their own do not:
    ranks that step together wait for each other, which their decode estimate leaves out, and share one
    fate (gateway/backends/vllm/data_parallel.py)."""
    if not alone:
        return groups
    best = min(_holds(shape) for shape in alone)
    return [group for group in groups if _holds(group) < best]


def _holds(shape: Shape) -> tuple[Any, ...]:
    """What a shape holds: the engine rule and the objective, then the sessions kept warm."""
    return (*_standing(shape), -_warm_step(shape))


def _device_env(plan: Plan, devices: tuple[Device, ...]) -> dict[str, str]:
    """The chosen engine's words for running on ``devices`` alone."""
    chosen = plan.chosen
    engine = plan.engine(chosen.engine) if chosen is not None else None
    return engine.backend.device_env(devices) if engine is not None else {}


def _each(sessions: int, replicas: int) -> int:
    """The sessions one replica is planned for."""
    return math.ceil(sessions / replicas)


def _shares(sessions: int, replicas: int) -> list[int]:
    """The sessions asked for, spread as evenly as they go (the router's least loaded placement)."""
    return [sessions // replicas + (1 if i < sessions % replicas else 0) for i in range(replicas)]


def _steady(plan: Plan) -> bool:
    """Its decision meets the floor without weights in RAM: a replica worth running."""
    chosen = plan.chosen
    return chosen is not None and not chosen.traits.below_floor and not chosen.traits.offload


def _has_gpus(plan: Plan) -> bool:
    return any(not d.is_cpu for d in (*plan.inventory.gpus, *plan.inventory.remote))


def _cpu_replicas(plan: Plan, one: Shape, asked: int) -> Replication:
    """``asked`` copies of the CPU plan, only where the user asks for them (no GPU to weigh, so never chosen by
    auto): one on this machine, then one on each worker that lends its CPU, in turn (a worker runs its copy
    as a whole engine server; those on one machine share its cores: serve gives each its share of the
    threads). Each copy is this machine's plan alone (never pooled over the others' devices), the worker's
    RAM taken as this machine's, as for a GPU replica."""
    sessions = _each(plan.policy.sessions, asked)
    alone = _alone(plan, sessions)
    nodes = ["", *sorted({d.node for d in plan.inventory.remote if d.is_cpu and d.node})]
    replicas = tuple(Replica(i, nodes[i % len(nodes)], (), alone, {}, sessions) for i in range(asked))
    where = "this machine's CPU" if len(nodes) == 1 else f"the CPUs of {len(nodes)} nodes, one each in turn"
    why = f"{asked} replicas as asked, on {where} (each its share of its node's cores)"
    return Replication(Shape(replicas, plan.policy.sessions), one, None, asked, why)


def _alone(plan: Plan, sessions: int) -> Plan:
    """``plan`` for this machine's devices alone (the other nodes' left out), for ``sessions``."""
    whole = plan.inventory
    if not whole.remote:
        return plan
    machine = Inventory(whole.gpus, whole.ram_total_bytes, whole.ram_available_bytes, source=whole.source)
    policy = replace(plan.policy, sessions=sessions, pool_nodes=False)
    fresh = [EnginePlan(e.backend, e.installation, e.model) for e in plan.engines]
    return evaluate_and_choose(plan.model, fresh, machine, policy)


def _one_engine(plan: Plan) -> Shape | None:
    """The plan's decision as the one engine (over the GPUs it chose)."""
    chosen = plan.chosen
    if chosen is None:
        return None
    return Shape((Replica(0, "", chosen.devices, plan, {}, plan.policy.sessions),), plan.policy.sessions)


def _pooled(plan: Plan, one: Shape) -> Shape | None:
    """One engine over every node, where the decision leaves other nodes idle and an engine pools them
    (its best fitting candidate over the nodes, startable or planned only), else None."""
    others = [node for node, gpus in plan.inventory.nodes.items() if node and gpus]
    if not others or set(others) <= set(one.replicas[0].chosen.nodes):
        return None
    fresh = [EnginePlan(e.backend, e.installation, e.model) for e in plan.engines]
    pooled = evaluate_and_choose(plan.model, fresh, plan.inventory, replace(plan.policy, pool_nodes=True))
    spanning = [c for c in pooled.candidates if c.fits and c.nodes]
    if not spanning:
        return None
    best: Candidate = objective.ranked(spanning, lambda c: c.traits)[0]
    at = next(i for i, c in enumerate(pooled.candidates) if c is best)
    pooled = replace(pooled, decision_backend=best.engine, decision_index=at, fallback_index=None)
    devices = tuple(
        d for d in (*plan.inventory.gpus, *plan.inventory.remote) if not d.is_remote or d.node in best.nodes
    )
    return Shape((Replica(0, "", devices, pooled, {}, plan.policy.sessions),), plan.policy.sessions)


def _warm(shape: Shape) -> int:
    """Sessions kept warm, counted up to those asked for: more than that wins nothing."""
    return min(shape.warm, shape.sessions)


def _warm_step(shape: Shape) -> int:
    """Sessions kept warm in steps of a tenth of those asked for (:data:`WARM_STEP`): 15 or 14 of 16 warm
    is one standing (the least recently used turns prefill again either way), 16 of 16 is better."""
    return _warm(shape) // max(1, round(shape.sessions * WARM_STEP))


def _standing(shape: Shape) -> tuple[Any, ...]:
    """The planner's engine rule, then the objective: a shape whose engine meets the floor without weights
    in RAM (and keeps turns warm) comes first in the registry's order of engines, as one engine's decision
    does (gateway/planning/planner.py); then the objective's steps up to precision, of the worst replica."""
    traits = shape.traits
    if traits.below_floor or traits.offload:
        tier: tuple[int, int] = (2, 0)
    else:
        tier = (int(traits.cold_turns), registry.names().index(shape.replicas[0].chosen.engine))
    return (*tier, *objective.standing(traits))


def _rank(shape: Shape) -> tuple[Any, ...]:
    """Layouts of replicas, best first: the engine rule and the objective, sessions kept warm, aggregate
    decode, fewer engines."""
    return (*_holds(shape), -round(shape.decode), shape.grouped, shape.count)


def _replicas_win(replicas: Shape, one: Shape) -> bool:
    """Replicas over one engine: better by the engine rule and the objective, else more of the sessions
    kept warm, else :data:`REPLICA_GAIN` times the aggregate decode."""
    mine, theirs = _standing(replicas), _standing(one)
    if mine != theirs:
        return mine < theirs
    if _warm_step(replicas) != _warm_step(one):
        return _warm_step(replicas) > _warm_step(one)
    return replicas.decode >= REPLICA_GAIN * one.decode


def _compare(chosen: Shape, other: Shape) -> str:
    """Why ``chosen`` and not ``other``, in the plan's own figures."""
    name, other_name = _kind(chosen), _kind(other)
    engine, other_engine = chosen.replicas[0].chosen.engine, other.replicas[0].chosen.engine
    mine, theirs = _standing(chosen), _standing(other)
    if mine[:2] != theirs[:2] and engine != other_engine and mine[0] < 2:
        first, then = _title_of(chosen), _title_of(other)
        return f"{name}: {first} meets the floor and comes first ({other_name} would run {then})"
    lost = objective.lost_on(chosen.traits, other.traits)
    if mine != theirs and lost:
        return f"{name}; {other_name}: {lost}"
    asked = chosen.sessions
    typical = f"{min(chosen.context, AGENT_PROMPT_TOKENS):,}"
    ratio = chosen.decode / other.decode if other.decode else 0.0
    decodes = "decodes" if _one(chosen) else "decode"
    speed = f"{decodes} ~{chosen.decode:,.0f} tokens/s with the {asked} at once ({other_name}: ~{other.decode:,.0f}"
    speed += f", ×{ratio:.2f})" if ratio else ")"
    if _warm_step(chosen) != _warm_step(other):
        keep = "keeps" if _one(chosen) else "keep"
        warm = f"{keep} {_warm(chosen)} of the {asked} sessions asked for warm at {typical} tokens"
        return f"{name} {warm} ({other_name}: {_warm(other)}) and {speed}"
    if _warm(chosen) == _warm(other):
        both = f"both keep {_warm(chosen)} of the {asked} sessions asked for warm at {typical} tokens"
    else:  # within a tenth of the sessions asked for
        both = f"{_warm(chosen)} and {_warm(other)} of the {asked} sessions asked for kept warm count alike"
    faster = other.count > 1 and other.decode > chosen.decode
    gain = f"; replicas must decode ×{REPLICA_GAIN:g} one engine's to be worth more engines" if faster else ""
    return f"{name}: {both}; {name} {speed}{gain}{_slower_alone(chosen, other, other_name)}"


def _why_not(chosen: Shape, weighed: tuple[Shape, ...]) -> str:
    """Why the chosen replicas and not the runner-up layout of replicas (e.g. one replica per node where one
    per GPU won), by the same order: the engine rule and the objective, sessions kept warm, aggregate decode."""
    if not weighed:
        return ""
    rival = weighed[0]
    name, rival_name = _layout(chosen), _layout(rival)
    mine, theirs = _standing(chosen), _standing(rival)
    if mine != theirs and (lost := objective.lost_on(chosen.traits, rival.traits)):
        return f"{rival_name}: {lost}"
    goal = chosen.traits.goal
    contexts = sorted({chosen.context, rival.context})
    reach = (
        f"the {goal.target:,}-token target (context {' and '.join(f'{c:,}' for c in contexts)}: past it, more counts "
        "for nothing here)"
        if min(contexts) >= goal.target
        else f"context {contexts[0]:,} alike"
    )
    asked, typical = chosen.sessions, f"{min(chosen.context, AGENT_PROMPT_TOKENS):,}"
    if _warm_step(chosen) != _warm_step(rival):
        return (
            f"{rival_name}: both reach {reach}; sessions kept warm at {typical} tokens: {_warm(chosen)} of the "
            f"{asked} asked for against {_warm(rival)}"
        )
    ratio = f", ×{chosen.decode / rival.decode:.2f}" if rival.decode else ""
    decodes = "decodes" if _one(chosen) else "decode"
    return (
        f"{rival_name}: both reach {reach} and keep {_warm(chosen)} of the {asked} sessions asked for warm at "
        f"{typical} tokens; {name} {decodes} ~{chosen.decode:,.0f} tokens/s with the {asked} at once, "
        f"{rival_name} ~{rival.decode:,.0f}{ratio}{_slower_alone(chosen, rival, rival_name)}"
    )


def decode_at(shape: Shape, requests: int) -> float:
    """The shape's aggregate decode with ``requests`` decoding at once, spread as the router spreads new sessions
    (each engine's own estimate, at most what it runs at once)."""
    total = 0.0
    for replica, share in zip(shape.replicas, _shares(requests, shape.count), strict=True):
        if share:
            total += replica.chosen.decode_rate(min(share, replica.chosen.at_once))
    return total


def _slower_alone(chosen: Shape, other: Shape, other_name: str) -> str:
    """Where ``other`` decodes faster than ``chosen`` with fewer requests at once than the sessions asked for
    (one request alone on a TP2 engine, say): up to how many, in the plan's figures; "" where never."""
    faster = [n for n in range(1, chosen.sessions) if decode_at(other, n) > decode_at(chosen, n)]
    if not faster or faster != list(range(1, faster[-1] + 1)):
        return ""
    most = faster[-1]
    requests = "1 request" if most == 1 else f"{most} requests or fewer"
    return (
        f"; {other_name} {'is' if _one(other) else 'are'} faster only with {requests} at once "
        f"(~{decode_at(other, most):,.0f} against ~{decode_at(chosen, most):,.0f})"
    )


def _layout(shape: Shape) -> str:
    """ "4 replicas of 1 GPU", "2 replicas of 2 GPUs", "a group of 2 ranks of 1 GPU", "one engine"."""
    if shape.count == 1:
        return "one engine"
    gpus = len(shape.replicas[0].devices)
    size = f"{gpus} GPU{'s' if gpus != 1 else ''}"
    return f"a group of {shape.count} ranks of {size}" if shape.grouped else f"{shape.count} replicas of {size}"


def _as_asked(asked: int, chosen: Shape, other: Shape) -> str:
    """--replicas N decided: both shapes' figures side by side."""
    typical = f"{min(chosen.context, AGENT_PROMPT_TOKENS):,}"
    figures = [
        f"{_kind(s)}: {_warm(s)} of the {s.sessions} sessions asked for kept warm at {typical} tokens, "
        f"~{s.decode:,.0f} tokens/s with the {s.sessions} at once"
        for s in (chosen, other)
    ]
    return f"--replicas {asked}, as asked; " + "; ".join(figures)


def _title_of(shape: Shape) -> str:
    first = shape.replicas[0]
    return _title(first.plan, first.chosen.engine)


def _one(shape: Shape) -> bool:
    """Named in the singular: one engine, or a group (one engine of several ranks)."""
    return shape.count == 1 or shape.grouped


def _kind(shape: Shape) -> str:
    if shape.grouped:
        return f"a group of {shape.count} ranks"
    return "one engine" if shape.count == 1 else f"{shape.count} replicas"


def _too_many(plan: Plan, asked: int, most: int) -> str:
    """--replicas N where fewer fit: how many do, and what to pass."""
    floor = plan.policy.goal.floor
    if most < 2:
        return (
            f"--replicas {asked}: no GPUs of one node hold {plan.model} at the {floor:,}-token floor on their own: "
            "pass --replicas 1 or auto"
        )
    return (
        f"--replicas {asked}: at most {most} replicas of {plan.model} meet the {floor:,}-token floor here: "
        f"pass --replicas {most} or auto"
    )


def shape_line(plan: Plan, shape: Shape) -> str:
    """One line: the shape, where each engine runs, and the figures the choice weighs."""
    first = shape.replicas[0].chosen
    title = _title(plan, first.engine)
    what = first.headline.split(", context ")[0]
    if shape.count == 1:
        head = f"one engine: {title} {what} on {where(shape.replicas[0])}"
        idle = [node for node, gpus in plan.inventory.nodes.items() if node and gpus and node not in first.nodes]
        if first.nodes:
            head += f" (every step crosses the link to {', '.join(first.nodes)})"
        elif idle:
            head += f" ({', '.join(idle)} idle)"
    else:
        group = " as one group" if shape.grouped else ""
        head = f"{shape.count} replicas{group}: {title} {what} on " + "; ".join(where(r) for r in shape.replicas)
    typical = min(shape.context, AGENT_PROMPT_TOKENS)
    return (
        f"{head}: context {shape.context:,}, {shape.at_once:,} at once, {shape.warm} sessions kept warm at "
        f"{typical:,} tokens, ~{shape.decode:,.0f} tokens/s with {shape.sessions} decoding at once"
    )


def where(replica: Replica) -> str:
    """ "this machine's GPUs 0,1", "node2's GPU 0", "this machine's GPUs 0,1 and node2's GPUs 0,1"."""
    nodes: dict[str, list[str]] = {}
    for d in replica.devices:
        nodes.setdefault(d.node, []).append(str(d.index))
    parts = []
    for node, indices in nodes.items():
        owner = "this machine's" if not node else f"{node}'s"
        parts.append(f"{owner} GPU{'s' if len(indices) > 1 else ''} {','.join(indices)}")
    return " and ".join(parts) or "this machine"


def sessions_line(shape: Shape) -> str:
    """The plan's line on sessions for replicas: each one's share, what they run at once and keep warm."""
    typical = min(shape.context, AGENT_PROMPT_TOKENS)
    shares = sorted({r.sessions for r in shape.replicas}, reverse=True)
    kind = "ranks" if shape.grouped else "replicas"
    line = (
        f"sessions: {shape.sessions} asked, {'-'.join(map(str, shares))} on each of {shape.count} {kind}; "
        f"{shape.at_once:,} at once, {shape.warm} kept warm at {typical:,} tokens in all"
    )
    if shape.sessions > shape.warm:
        line += "; more than that and the least recently used sessions prefill again"
    if any(r.sessions > r.chosen.at_once for r in shape.replicas):
        line += "; more requests than a replica runs at once wait in the gateway's queue (warm turns first)"
    return line


def _title(plan: Plan, name: str) -> str:
    engine = plan.engine(name)
    return engine.backend.title if engine else name
