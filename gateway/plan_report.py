"""The human form of a plan: inventory, each engine's rows (the backend formats its own), the decision,
the command."""

from __future__ import annotations

import shlex

from gateway.hardware import GIB, MIB
from gateway.planner import Plan


def render(plan: Plan) -> str:
    inv = plan.inventory
    lines = [f"model {plan.model}"]
    if inv.gpus:
        for g in inv.gpus:
            cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
            total, free = g.total_bytes / MIB, g.free_bytes / MIB
            lines.append(f"GPU{g.index} {g.name}: {total:,.0f} MiB total, {free:,.0f} MiB free, cc {cc}")
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
        lines.append("command: " + shlex.join(chosen.argv))
    return "\n".join(lines)
