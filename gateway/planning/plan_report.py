"""The human form of a plan: inventory, each engine's rows (the backend formats its own), the decision,
the command.

The command is one a person can paste: the engine's environment first, the port the gateway would
listen on instead of the ``PORT`` placeholder, and the API key read from ``$GATEWAY_API_KEY`` instead of
``KEY`` (double-quoted, so the shell expands it; never a key on screen).
"""

from __future__ import annotations

import shlex
from typing import Any

from backends.base import Candidate
from gateway.core.devices import GIB, MIB
from gateway.planning.planner import Plan

API_KEY_VARIABLE = "GATEWAY_API_KEY"  # the variable `gateway agent` configurations read the key from too


def _word(text: str) -> str:
    """One shell word; the key placeholder becomes the variable, expanded by the shell."""
    if text == "KEY":
        return f'"${API_KEY_VARIABLE}"'
    return shlex.quote(text)


def paste_command(candidate: Candidate, port: int) -> str:
    """The candidate's engine command as one shell line: env, argv, real port, key from the environment."""
    argv = [str(port) if word == "PORT" else word for word in candidate.argv]
    env = [f"{name}={_word(value)}" for name, value in candidate.env.items()]
    return " ".join([*env, *(_word(word) for word in argv)])


def to_json(plan: Plan, port: int) -> dict[str, Any]:
    """The plan's JSON with the chosen candidate's pasteable command (null when nothing fits)."""
    data = plan.to_json()
    chosen = plan.chosen
    data["command"] = paste_command(chosen, port) if chosen is not None else None
    if (fallback := plan.fallback) is not None:
        data["decision"]["fallback"]["command"] = paste_command(fallback, port)
    return data


def render(plan: Plan, port: int = 8000, *, verbose: bool = False) -> str:
    """The plan for people: the decision first (its figures, one line of why, the command), the other
    engine's best with its command, the machine and the context asked for, then one line per
    checkpoint × TP or quantization and the notes; every rung under ``verbose``."""
    chosen = plan.chosen
    if chosen is None:
        lines = [f"decision: none: {plan.decision_reason}"]
    else:
        title = _title(plan, chosen.engine)
        loud = f" (LAST RESORT: below the {plan.policy.min_context:,}-token floor)" if plan.last_resort else ""
        lines = [f"decision{loud}: {title}: {chosen.headline}", f"why: {plan.why}"]
        lines.append(f"command (the engine alone on port {port}, its key from ${API_KEY_VARIABLE}):")
        lines.append("  " + paste_command(chosen, port))
    if (fallback := plan.fallback) is not None:
        title = _title(plan, fallback.engine)
        if plan.not_installed(plan.decision_backend):
            when = f"{plan.decision_backend} is not installed here: `serve` on this machine starts this instead"
        else:
            when = f"`serve` starts this if {plan.decision_backend} does not start"
        lines.append(f"other engine: {title}: {fallback.headline}")
        lines.append(f"  {when}:")
        lines.append("  " + paste_command(fallback, port))
    lines.append("")
    lines.append(f"model {plan.model} on {_machine(plan)}")
    lines.append(f"engines: {plan.versions()}")
    goal = plan.policy.goal
    floor = f"floor {goal.floor:,}" + (" (hard: --min-context or a pinned context)" if goal.hard else "")
    top = f", at most {plan.policy.max_context:,}" if plan.policy.max_context else ""
    lines.append(f"context: {floor}, target {goal.target:,}{top}")
    if chosen is not None:  # the model's recommended sampling, its source, and how the engine applies it
        lines.append(chosen.sampling_line)
    if sessions := plan.sessions_line():
        lines.append(sessions)
    for engine in plan.engines:
        if engine.candidates:
            lines += engine.backend.summary(engine.candidates, chosen)
    lines += [f"note: {note}" for note in plan.notes]
    if verbose:
        for engine in plan.engines:
            if engine.candidates:
                lines.append("")
                lines += engine.backend.rows(engine.candidates, chosen)
    else:
        lines.append("(every rung: --verbose; every figure: --json)")
    return "\n".join(lines)


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
