"""The human form of a plan: inventory, one line per candidate worth reading, the decision, the command."""

from __future__ import annotations

import shlex

from backends import llamacpp, vllm
from gateway.hardware import GIB, MIB
from gateway.planner import Plan

MAX_ROWS = 14


def _vllm_rows(candidates: list[vllm.VllmCandidate], chosen: object) -> list[str]:
    """One row per rung group: the best sequence count of each (TP, util, eager, KV, checkpoint)."""
    groups: dict[tuple[object, ...], vllm.VllmCandidate] = {}
    for c in candidates:
        f = c.flags
        key = (c.checkpoint.name, f.tensor_parallel_size, f.gpu_memory_utilization, f.enforce_eager, f.kv_cache_dtype)
        current = groups.get(key)
        rank = (c.fits, c.context if c.fits else c.memory.max_fitting_model_len)
        if current is None or c is chosen:
            groups[key] = c
        elif current is not chosen:
            current_rank = (current.fits, current.context if current.fits else current.memory.max_fitting_model_len)
            if rank > current_rank:
                groups[key] = c
    rows = []
    header = f"  {'':2}{'rung':<52} {'weights':>8} {'act':>6} {'graphs':>6} {'KV/GPU':>7} {'tokens':>9} {'context':>8}"
    rows.append(header)
    for c in sorted(groups.values(), key=lambda c: (c.level, -c.context))[:MAX_ROWS]:
        m = c.memory
        mark = "=>" if c is chosen else "ok" if c.fits else "--"
        rows.append(
            f"  {mark:2}{c.rung[:52]:<52} {m.weights / GIB:8.2f} {m.activation / GIB:6.2f} {m.cudagraph / GIB:6.2f}"
            f" {max(m.kv_cache, 0) / GIB:7.2f} {m.kv_tokens:9,} {c.context:8,}"
        )
        if not c.fits:
            rows.append(f"      {c.reason}")
    if len(groups) > MAX_ROWS:
        rows.append(f"  … {len(groups) - MAX_ROWS} more rung groups in --json")
    return rows


def _llama_rows(candidates: list[llamacpp.LlamaCppCandidate], chosen: object) -> list[str]:
    rows = []
    for c in candidates:
        mark = "=>" if c is chosen else "ok" if c.fits else "--"
        p = c.placement
        split = ",".join(f"{s:g}" for s in p.tensor_split) or "-"
        rows.append(f"  {mark:2}{c.launcher} -ngl {p.n_gpu_layers} -ts {split} ctx {c.n_ctx:,} KV {c.kv_type}")
        rows.append(f"      {c.reason}")
    return rows


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
    lines.append(f"host RAM available {ram:.1f} GiB; vLLM {plan.vllm_version} ({plan.vllm_version_source})")
    lines.append(
        f"policy: context at least {plan.policy.min_context:,}"
        + (f", at most {plan.policy.max_context:,}" if plan.policy.max_context else "")
    )
    lines += [f"note: {note}" for note in plan.notes]
    chosen = plan.chosen
    if plan.vllm_candidates:
        lines.append("")
        lines.append("vLLM candidates (per GPU, GiB):")
        lines += _vllm_rows(plan.vllm_candidates, chosen)
    if plan.llamacpp_candidates:
        lines.append("")
        lines.append("llama.cpp candidates:")
        lines += _llama_rows(plan.llamacpp_candidates, chosen)
    lines.append("")
    lines.append(f"decision: {plan.decision_backend or 'none'}: {plan.decision_reason}")
    if chosen is not None:
        lines.append("command: " + shlex.join(chosen.argv))
    return "\n".join(lines)
