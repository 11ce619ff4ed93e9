"""A plan from the user's settings: each engine's installation and reading of the model, the policy
(pins, the context floor and target, the remembered configuration's calibration), then the planner's
choice and the shape weighed for it (one engine or replicas, gateway/planning/replicas.py). What
`gateway plan`, `serve` and a re-plan over the workers all make.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from gateway.backends import registry
from gateway.core.devices import Inventory
from gateway.core.model_entry import ModelEntry
from gateway.core.policy import policy_for
from gateway.core.settings import Settings
from gateway.planning.planner import EnginePlan, Plan, evaluate_and_choose, read_engines
from gateway.planning.replicas import weigh
from gateway.remembered.known_good import KnownGood


def model_limit(entry: ModelEntry, engines: list[EnginePlan]) -> int | None:
    """The model's own context limit: the smallest that the catalog or any engine's files state."""
    limits = [entry.max_context] + [e.model.max_position for e in engines if e.model is not None]
    return min((limit for limit in limits if limit), default=None)


def plan_for(settings: Settings, entry: ModelEntry, machine: Inventory, *, serving: bool) -> Plan:
    """The plan with the configuration remembered for this model and machine (`gateway plan`, a re-plan
    over the workers: each reads it for its own machine)."""
    remembered = KnownGood(settings.state_dir).get(entry.name, machine.fingerprint)
    return plan_given(settings, entry, machine, serving=serving, remembered=remembered)


def plan_given(
    settings: Settings, entry: ModelEntry, machine: Inventory, *, serving: bool, remembered: dict[str, Any] | None
) -> Plan:
    """Read the model with every engine, build the policy, evaluate every ladder, choose.

    ``serving``: ask the engines' commands for their versions (plan only reads package metadata).
    ``remembered``: the configuration remembered here, as the caller read it (its measured speed
    calibrates the estimates and is noted)."""
    installations = {
        b.name: b.installation(settings, probe=serving and entry.source(b.name) is not None) for b in registry.BACKENDS
    }
    with _no_progress_bars():  # huggingface_hub's "Parse safetensors files" bars would land in the plan
        engines = read_engines(entry, installations)
    policy = replace(policy_for(settings, model_limit(entry, engines), bool(machine.gpus)), remembered=remembered)
    plan = evaluate_and_choose(entry.name, engines, machine, policy)
    plan.replication = weigh(plan, settings.replica_count)
    if remembered and (note := measured_note(remembered)):
        plan.notes.append(note)
    return plan


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """huggingface_hub's progress bars off while the model's facts are read; as they were after."""
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazy exports
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    were_off = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not were_off:
            enable_progress_bars()


def measured_note(remembered: dict[str, Any]) -> str | None:
    """The engine's own speed on the remembered configuration, beside what the plan estimated."""
    measured = remembered.get("measured") or {}
    decode = measured.get("decode_tokens_per_s")
    if not decode:
        return None
    estimated = measured.get("estimated_decode_tokens_per_s")
    prompt = measured.get("prompt_tokens_per_s")
    text = f"measured on {measured.get('when', '?')} ({remembered.get('engine')}): decode {decode} tokens/s"
    text += f", prompt {prompt} tokens/s" if prompt else ""
    if acceptance := measured.get("draft_acceptance"):
        text += f", {acceptance:.0%} of drafted tokens accepted"
    if estimated:
        text += f"; estimated {estimated} tokens/s then (measured/estimated {decode / estimated:.2f})"
    return text
