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


def render(plan: Plan, port: int = 8000) -> str:
    inv = plan.inventory
    lines = [f"model {plan.model}"]
    if inv.gpus:
        for g in inv.gpus:
            total, free = g.total_bytes / MIB, g.free_bytes / MIB
            lines.append(f"GPU{g.index} {g.name}: {total:,.0f} MiB total, {free:,.0f} MiB free, cc {g.capability}")
    else:
        lines.append("no GPUs: CPU plan")
    ram = inv.ram_available_bytes / GIB
    versions = "; ".join(
        f"{e.backend.title} {e.installation.version} ({e.installation.version_source})" for e in plan.engines
    )
    lines.append(f"host RAM available {ram:.1f} GiB; {versions}")
    lines.append(
        f"policy: context at least {plan.policy.min_context:,}"
        + (f", at most {plan.policy.max_context:,}" if plan.policy.max_context else "")
    )
    lines += [f"note: {note}" for note in plan.notes]
    chosen = plan.chosen
    for engine in plan.engines:
        if engine.candidates:
            lines.append("")
            lines += engine.backend.rows(engine.candidates, chosen)
    lines.append("")
    lines.append(f"decision: {plan.decision_backend or 'none'}: {plan.decision_reason}")
    if chosen is not None:
        lines.append(f"command (the engine alone on port {port}, its key from ${API_KEY_VARIABLE}):")
        lines.append("  " + paste_command(chosen, port))
    if (fallback := plan.fallback) is not None:
        lines.append(f"fallback: {fallback.engine}: {fallback.label}: {fallback.reason}")
        if plan.not_installed(plan.decision_backend):
            lines.append(
                f"  {plan.decision_backend} is not installed here: `serve` on this machine starts this instead:"
            )
        else:
            lines.append(f"  `serve` starts this if {plan.decision_backend} does not start:")
        lines.append("  " + paste_command(fallback, port))
    return "\n".join(lines)
