"""The human form of a plan: inventory, each engine's rows (the backend formats its own), the decision,
the command.

The command is one a person can paste: the engine's environment first, the port the gateway would
listen on instead of the ``PORT`` placeholder, and the API key read from ``$GATEWAY_API_KEY`` instead of
``KEY`` (double-quoted, so the shell expands it; never a key on screen).
"""

from __future__ import annotations

import shlex
from typing import Any

from gateway.backends.base import Candidate
from gateway.core.devices import GIB, MIB
from gateway.planning.planner import Plan, Replica, Replication, Shape
from gateway.planning.replicas import sessions_line, shape_line, where

API_KEY_VARIABLE = "GATEWAY_API_KEY"  # the variable `gateway agent` configurations read the key from too


def _word(text: str) -> str:
    """One shell word; the key placeholder becomes the variable, expanded by the shell."""
    if text == "KEY":
        return f'"${API_KEY_VARIABLE}"'
    return shlex.quote(text)


def paste_command(candidate: Candidate, port: int, argv: list[str] | None = None) -> str:
    """The candidate's engine command as one shell line: env, argv (``argv``: its own, as a replica runs
    it), real port, key from the environment."""
    words = [str(port) if word == "PORT" else word for word in (candidate.argv if argv is None else argv)]
    env = [f"{name}={_word(value)}" for name, value in candidate.env.items()]
    return " ".join([*env, *(_word(word) for word in words)])


def to_json(plan: Plan, port: int) -> dict[str, Any]:
    """The plan's JSON with the chosen candidate's pasteable command (null when nothing fits), and each
    replica's where replicas are shown."""
    data = plan.to_json()
    chosen = plan.chosen
    data["command"] = paste_command(chosen, port) if chosen is not None else None
    if (fallback := plan.fallback) is not None:
        data["decision"]["fallback"]["command"] = paste_command(fallback, port)
    replication = plan.replication
    if replication is not None and replication.shown:
        ports = _ports(replication.chosen, port)
        for replica, shown in zip(replication.chosen.engines, data["replicas"]["replicas"], strict=True):
            shown["port"] = ports[replica.index]
            shown["command"] = _command(replica, ports[replica.index])
    return data


def _ports(shape: Shape, port: int) -> dict[int, int]:
    """Each engine's port in the pasteable commands: the engines on one node one port after another."""
    seen: dict[str, int] = {}
    ports = {}
    for replica in shape.engines:
        ports[replica.index] = port + seen.get(replica.node, 0)
        seen[replica.node] = seen.get(replica.node, 0) + 1
    return ports


def _command(replica: Replica, port: int) -> str:
    """A replica's engine command: its device pinning in front of the engine's own."""
    pins = [f"{name}={_word(value)}" for name, value in replica.env.items()]
    return " ".join([*pins, paste_command(replica.chosen, port, replica.argv)])


def render(plan: Plan, port: int = 8000, *, verbose: bool = False) -> str:
    """The plan for people: the decision first (its figures, one line of why, the command), the other
    engine's best with its command, the machine and the context asked for, then one line per
    checkpoint × TP or quantization and the notes; every rung under ``verbose``. Where replicas are the
    decision, each replica's command, and its plan's rows (the replicas plan alike)."""
    replication = plan.replication
    if replication is not None and replication.chosen.count > 1:
        return _render_replicas(plan, replication, port, verbose=verbose)
    chosen = plan.chosen
    if chosen is None:
        lines = [f"decision: none: {plan.decision_reason}"]
    else:
        title = _title(plan, chosen.engine)
        loud = f" (LAST RESORT: below the {plan.policy.min_context:,}-token floor)" if plan.last_resort else ""
        lines = [f"decision{loud}: {title}: {chosen.headline}", f"why: {plan.why}"]
        lines.append(f"command (the engine alone on port {port}, its key from ${API_KEY_VARIABLE}):")
        lines.append("  " + paste_command(chosen, port))
    lines += _fallback_lines(plan, port)
    lines += ["", *_machine_lines(plan)]
    if sessions := plan.sessions_line():
        lines.append(sessions)
    if replication is not None:  # one engine, weighed against replicas: the other shape in one line
        lines.append(f"shape: {replication.why}")
        lines += [f"  other shape: {shape_line(plan, s)}" for s in (replication.other, replication.pooled) if s]
        lines += [f"  also weighed: {shape_line(plan, s)}" for s in replication.weighed]
    lines += _rows(plan, verbose=verbose)
    return "\n".join(lines)


def _render_replicas(plan: Plan, replication: Replication, port: int, *, verbose: bool) -> str:
    """The plan when replicas are the decision: the shape and why, the other shape, each replica's
    command on its node; then the first replica's own plan (each one's ladder is alike)."""
    shape = replication.chosen
    first = shape.replicas[0]
    chosen = first.chosen
    title = _title(plan, chosen.engine)
    what = f"{shape.count} replicas, each {title}"
    if shape.grouped:
        group = f"a data-parallel group of {shape.count} ranks (they step together: one fate)"
        what = f"one {title} engine, {group}, each rank"
    lines = [
        f"decision: {what}: {chosen.headline}",
        f"why: {replication.why}",
    ]
    if replication.why_not:
        lines.append(f"why not {replication.why_not}")
    lines.append(f"each {'rank' if shape.grouped else 'replica'}: {first.plan.why}")
    lines += [f"other shape: {shape_line(plan, s)}" for s in (replication.other, replication.pooled) if s]
    lines += [f"also weighed: {shape_line(plan, s)}" for s in replication.weighed]
    lines.append(f"commands (each engine alone on its node, its key from ${API_KEY_VARIABLE}):")
    ports = _ports(shape, port)
    for replica in shape.engines:
        name = f"the group's engine ({replica.ranks} ranks)" if replica.ranks > 1 else f"replica {replica.index + 1}"
        lines.append(f"  {name} on {where(replica)}, port {ports[replica.index]}:")
        lines.append("    " + _command(replica, ports[replica.index]))
    lines += _fallback_lines(first.plan, port, each=True)
    lines += ["", *_machine_lines(plan), sessions_line(shape)]
    lines += _rows(first.plan, verbose=verbose, notes=[*plan.notes, *first.plan.notes])
    return "\n".join(lines)


def _fallback_lines(plan: Plan, port: int, *, each: bool = False) -> list[str]:
    """The other engine's best and when `serve` starts it (``each``: of every replica)."""
    fallback = plan.fallback
    if fallback is None:
        return []
    title = _title(plan, fallback.engine)
    if plan.not_installed(plan.decision_backend):
        when = f"{plan.decision_backend} is not installed here: `serve` on this machine starts this instead"
    else:
        when = f"`serve` starts this if {plan.decision_backend} does not start"
    return [
        f"other engine{' of each replica' if each else ''}: {title}: {fallback.headline}",
        f"  {when}:",
        "  " + paste_command(fallback, port),
    ]


def _machine_lines(plan: Plan) -> list[str]:
    """The machine, the engines' versions and the context asked for."""
    goal = plan.policy.goal
    floor = f"floor {goal.floor:,}" + (" (hard: --min-context or a pinned context)" if goal.hard else "")
    top = f", at most {plan.policy.max_context:,}" if plan.policy.max_context else ""
    lines = [
        f"model {plan.model} on {_machine(plan)}",
        f"engines: {plan.versions()}",
        f"context: {floor}, target {goal.target:,}{top}",
    ]
    if (chosen := plan.chosen) is not None:  # the model's recommended sampling, its source, how the engine applies it
        lines.append(chosen.sampling_line)
    return lines


def _rows(plan: Plan, *, verbose: bool, notes: list[str] | None = None) -> list[str]:
    """Each engine's summary rows, the notes (each once), and every rung under ``verbose``."""
    chosen = plan.chosen
    lines: list[str] = []
    for engine in plan.engines:
        if engine.candidates:
            lines += engine.backend.summary(engine.candidates, chosen)
    lines += [f"note: {note}" for note in dict.fromkeys(plan.notes if notes is None else notes)]
    if verbose:
        for engine in plan.engines:
            if engine.candidates:
                lines.append("")
                lines += engine.backend.rows(engine.candidates, chosen)
    else:
        lines.append("(every rung: --verbose; every figure: --json)")
    return lines


def _title(plan: Plan, name: str) -> str:
    engine = plan.engine(name)
    return engine.backend.title if engine else name


def _machine(plan: Plan) -> str:
    """The inventory in a few words: identical GPUs counted once."""
    inv = plan.inventory
    kinds: dict[tuple[str, int, int, str], int] = {}
    for g in inv.gpus:
        key = (g.name, g.total_bytes, g.free_bytes, g.capability)
        kinds[key] = kinds.get(key, 0) + 1
    gpus = [
        f"{count} × {name} ({total / MIB:,.0f} MiB, {free / MIB:,.0f} free, cc {cc})"
        for (name, total, free, cc), count in kinds.items()
    ]
    ram = f"RAM {inv.ram_available_bytes / GIB:.1f} GiB available"
    remote = f", {len(inv.remote)} devices on other nodes" if inv.remote else ""
    return ", ".join(gpus or ["no GPU (CPU plan)"]) + remote + f", {ram}"
