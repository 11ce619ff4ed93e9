"""What /metrics and /status show of the plan being served, made from it: memory per device and term,
the devices it uses, and NVML's figures now for those that are this machine's real GPUs."""

from __future__ import annotations

from gateway.planning.planner import Plan
from gateway.serving.metrics import live_gpu_memory
from gateway.serving.runtime import PlanFigures, PlannedDevice

CPU_LABEL = "cpu"  # the ``gpu`` of a term an engine places on no listed device (vLLM's CPU build)


def plan_figures(plan: Plan) -> PlanFigures:
    """What /metrics and /status show of the plan: the chosen candidate's memory per device and term,
    the devices it uses (as planned: simulated ones too) and, for this machine's real GPUs among them,
    NVML's figures now. Every device is named by its label (its index on its own node as NVML numbers
    it), not by its position in the engine's device order that memory_terms() counts in."""
    details = {"candidates": [c.to_json() for c in plan.candidates]}
    chosen = plan.chosen
    if chosen is None:
        return PlanFigures(plan_memory=[], plan_kv_tokens=0, plan_details=details)
    devices = chosen.devices
    terms = [
        (devices[at].label if at < len(devices) else CPU_LABEL, term, value)
        for at, term, value in chosen.memory_terms()
    ]
    planned: dict[str, int] = {}
    for gpu, _term, value in terms:
        planned[gpu] = planned.get(gpu, 0) + value
    used = [device for device in devices if device.label in planned]
    real = frozenset(d.label for d in used if not d.is_remote) if plan.inventory.source == "nvml" else frozenset()
    return PlanFigures(
        plan_memory=terms,
        plan_kv_tokens=chosen.kv_tokens,
        plan_details=details,
        devices=tuple(PlannedDevice(d.label, d.name, d.total_bytes, planned[d.label]) for d in used),
        gpu_memory=live_gpu_memory(real) if real else None,
    )
