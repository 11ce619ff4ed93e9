"""vLLM's rows in `gateway plan`: one line per checkpoint × TP (its best rung, or its one reason),
and under ``--verbose`` one line per rung group, the reason under every rejected one."""

from __future__ import annotations

from gateway.backends.vllm.ladder import VllmCandidate, ranked
from gateway.backends.vllm.scheduling import step_phrase
from gateway.core.devices import GIB

MAX_ROWS = 14
ACROSS_ROWS = 6


def _rank(c: VllmCandidate) -> tuple[bool, int, int]:
    """Fitting rows show MTP speculative decoding where it fits; rejected rows the plain rung."""
    mtp = c.concessions.no_mtp
    return (c.fits, c.context_length if c.fits else c.memory.max_fitting_model_len, -mtp if c.fits else mtp)


def summary(candidates: list[VllmCandidate], chosen: object) -> list[str]:
    """One line per checkpoint × TP: its best rung by the plan's objective with what it gives up,
    or, when none fits, the one reason of the rung that came closest."""
    groups: dict[tuple[str, int], list[VllmCandidate]] = {}
    for c in candidates:
        if not c.planned_only:
            groups.setdefault((c.checkpoint.name, c.flags.tensor_parallel_size), []).append(c)
    lines = ["vLLM, the best rung per checkpoint × TP:"]
    for (name, tp), group in groups.items():
        first = group[0]
        what = f"{name.split('/')[-1]} ({first.checkpoint.quantization or first.checkpoint.facts.dtype}) TP{tp}"
        best = next(iter(ranked(group)), None)
        if best is None:
            closest = max(group, key=lambda c: (c.startable, c.memory.max_fitting_model_len))
            why = closest.problems[-1] if closest.problems else closest.reason
            lines.append(f"  -- {what}: {why.removeprefix(name + ': ')}")
            continue
        f = best.flags
        mark = "=>" if best is chosen else "ok"
        figures = f"context {best.context_length:,}, util {f.gpu_memory_utilization}, {f.max_num_seqs} seqs"
        figures += f", KV {f.kv_cache_dtype}" + (", eager" if f.enforce_eager else "")
        figures += f", ~{best.tokens_per_s:,.0f} tokens/s" if best.tokens_per_s else ""
        fragile = best.traits.shortfalls()
        lines.append(f"  {mark} {what}: {figures}" + (f" (gives up: {', '.join(fragile)})" if fragile else ""))
        if best is chosen and f.long_prefill_tokens:  # the plan's own step share, and why (scheduling.py)
            lines.append(f"     {step_phrase(f)}")
    across = [c for c in candidates if c.planned_only]
    return lines + (_across_nodes(across) if any(c.fits for c in across) else [])


def rows(candidates: list[VllmCandidate], chosen: object) -> list[str]:
    """One row per rung group: the best sequence count of each (TP, util, eager, KV, checkpoint)."""
    groups: dict[tuple[object, ...], VllmCandidate] = {}
    across = [c for c in candidates if c.planned_only]
    for c in (c for c in candidates if not c.planned_only):
        f = c.flags
        key = (c.checkpoint.name, f.tensor_parallel_size, f.gpu_memory_utilization, f.enforce_eager, f.kv_cache_dtype)
        current = groups.get(key)
        if current is None or c is chosen or (current is not chosen and _rank(c) > _rank(current)):
            groups[key] = c
    totals = sorted({c.memory.total for c in candidates if c.startable})
    total = f"; util × {totals[0] / GIB:.2f} GiB, the total CUDA reports" if totals else ""
    lines = [f"vLLM candidates (per GPU, GiB{total}):"]
    lines.append(
        f"  {'':3}{'rung':<52} {'weights':>8} {'act':>6} {'graphs':>6} {'KV/GPU':>7} {'tokens':>9} {'context':>8}"
    )
    for c in sorted(groups.values(), key=lambda c: (c.concessions, -c.context_length))[:MAX_ROWS]:
        m = c.memory
        mark = "=>" if c is chosen else "ok" if c.fits else "--"
        lines.append(
            f"  {mark:3}{c.rung[:52]:<52} {m.weights / GIB:8.2f} {m.activation / GIB:6.2f} {m.cudagraph / GIB:6.2f}"
            f" {max(m.kv_cache, 0) / GIB:7.2f} {m.kv_tokens:9,} {c.context_length:8,}"
        )
        if not c.fits:
            lines.append(f"      {c.reason}")
    if len(groups) > MAX_ROWS:
        lines.append(f"  … {len(groups) - MAX_ROWS} more rung groups in --json")
    return lines + _across_nodes(across)


def _across_nodes(candidates: list[VllmCandidate]) -> list[str]:
    """The TP×PP rungs over several nodes, and the steps of the best fitting one (never started)."""
    if not candidates:
        return []
    lines = ["", "vLLM across nodes (planned only, on vLLM's own launcher, no Ray; the same vLLM on every node):"]
    shown = sorted(candidates, key=lambda c: (not c.fits, c.flags.enforce_eager, -c.context_length))[:ACROSS_ROWS]
    for c in shown:
        m = c.memory
        lines.append(
            f"  {'ok' if c.fits else '--':3}{c.rung[:52]:<52} {m.weights / GIB:8.2f} {m.activation / GIB:6.2f}"
            f" {m.cudagraph / GIB:6.2f} {max(m.kv_cache, 0) / GIB:7.2f} {m.kv_tokens:9,} {c.context_length:8,}"
        )
    fitting = sorted((c for c in candidates if c.fits), key=lambda c: (c.flags.enforce_eager, -c.context_length))
    if fitting:
        lines.append(
            "  steps (HEAD: this machine's address as the workers reach it; NODE2…: each worker's; IFACE: "
            "the interface that reaches the head):"
        )
        lines += [f"    {number}. {step}" for number, step in enumerate(fitting[0].steps, 1)]
    return lines
