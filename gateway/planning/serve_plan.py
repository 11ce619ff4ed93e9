"""What `serve` starts, planned: the model, then every engine's options in the order they are tried
(the remembered configuration first), and the slot that remembers what worked.

The remembered configuration is read once here (the plan, its measured note and the first option all
use the one read). Each engine turns its own fitting candidates into options (vLLM: its best few
rungs, so a failure has somewhere to step down to; llama.cpp: its best placement); they are tried in
the registry's order of preference. Flags the user gave are pinned: when the plan says they do not fit
they are still tried first (the user asked), with a warning, and the engine's own numbers decide the
step down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gateway.backends.base import Option
from gateway.core.devices import Inventory
from gateway.core.errors import BackendError, ConfigError
from gateway.core.model_entry import ModelEntry
from gateway.core.settings import Settings
from gateway.planning.catalog import DEFAULT_MODEL, Catalog, catalog_with
from gateway.planning.from_settings import plan_for, plan_given
from gateway.planning.planner import Plan
from gateway.planning.remembered_repair import plan_remembered, rebuilt, remembered_first
from gateway.remembered.known_good import KnownGood, KnownGoodSlot

log = logging.getLogger("gateway.startup")  # serve's start-up lines, under one name


@dataclass(frozen=True)
class ServePlan:
    """What the plan gives `serve`: the model, the options to try in order, the plan they came from,
    where to remember what worked and, with workers, how to plan again."""

    entry: ModelEntry
    options: list[Option]
    plan: Plan
    remember: KnownGoodSlot
    # the plan made again over the nodes that answer now: its options and summary (for the supervisor)
    replan: Callable[[], Awaitable[tuple[list[Option], dict[str, Any]]]] | None = field(default=None, compare=False)
    # told of every plan made again, so /status and /metrics show the plan being served, not the first
    replanned: list[Callable[[Plan], None]] = field(default_factory=list, compare=False)


def plan_summary(plan: Plan) -> dict[str, Any]:
    """What /status shows of a plan: the decision, the engine versions, the notes."""
    return {"decision": plan.decision_reason, "engine_version": plan.versions(), "notes": plan.notes}


def choose_model(settings: Settings, catalog: Catalog, gpu_count: int) -> ModelEntry:
    if settings.model:
        return catalog.resolve(settings.model)
    if gpu_count:
        raise ConfigError(f"{gpu_count} GPU(s) found but no model given: pass --model NAME (see `gateway models`)")
    log.info("no model given and no GPU: serving the embedded default %s", DEFAULT_MODEL)
    return catalog.resolve(DEFAULT_MODEL)


def options_of(plan: Plan, settings: Settings) -> list[Option]:
    """Every engine's startable options: an engine whose own flags the user pinned first (the user
    asked, even where the plan says they do not fit), then the decision's engine, then the fallback's,
    then the others in the registry's order (so `serve` tries what `plan` decided)."""
    options: list[Option] = []
    given = set(plan.policy.pins.engine)
    pinned = [e.backend.name for e in plan.engines if given & set(e.backend.pins)]
    first = [*pinned, plan.decision_backend, plan.fallback.engine if plan.fallback is not None else None]
    order = sorted(plan.engines, key=lambda e: first.index(e.backend.name) if e.backend.name in first else len(first))
    for engine in order:
        if engine.model is not None:
            options += engine.backend.options(
                engine.model, engine.evaluation, plan.policy, engine.installation, settings
            )
    return options


def nothing_to_start(entry: ModelEntry, plan: Plan) -> BackendError:
    """`serve`'s error when no engine offers an option: the plan's reason, and the fix for each
    engine that has a fitting candidate but is not installed."""
    missing = [
        e.installation.missing or f"{e.backend.title} is not installed"
        for e in plan.engines
        if e.installation.command is None and e.backend.ranked(e.candidates)
    ]
    return BackendError(f"{entry.name} cannot be served here: " + "; ".join([plan.decision_reason, *missing]))


def plan_serving(
    settings: Settings,
    machine: Inventory,
    *,
    survey: Callable[[], Awaitable[Inventory]] | None = None,
    catalog: Catalog | None = None,
) -> ServePlan:
    """Plan what `serve` starts on ``machine`` (this one's devices and the other nodes' as they
    answered): the model, every engine's options in the order they are tried (the remembered
    configuration first), and where to remember what worked. ``survey``: the machine asked again, with
    the other nodes that answer now (a coroutine), for the plan made again when one is lost or back; None
    without other nodes."""
    catalog = catalog or catalog_with(settings.catalog_dir)
    entry = choose_model(settings, catalog, len(machine.gpus))
    store = KnownGood(settings.state_dir)
    remembered = store.get(entry.name, machine.fingerprint)  # the one read: plan, note and first option
    if remembered and not (settings.replan or settings.files_pinned()):  # e.g. a pinned quantization (--quant)
        # e.g. the hub variant that worked here: no new search (a pinned --quant searches again)
        plan, entry, remembered = plan_remembered(settings, entry, machine, remembered, store)
    else:
        plan = plan_given(settings, entry, machine, serving=True, remembered=remembered)
    _log_plan(plan, machine)
    options = options_of(plan, settings)
    if not options:
        raise nothing_to_start(entry, plan)
    slot = KnownGoodSlot(
        store=store,
        model=entry.name,
        fingerprint=machine.fingerprint,
        versions={e.backend.name: e.backend.memo_version(e.installation) for e in plan.engines},
    )
    if not settings.replan:
        # a memo that cannot be rebuilt is set aside, unless a pinned --quant is why it does not fit
        set_aside = None if settings.files_pinned() else partial(store.set_aside, entry.name, machine.fingerprint)
        options = remembered_first(options, slot, remembered, lambda memo: rebuilt(options, memo, set_aside))
    replanned: list[Callable[[Plan], None]] = []
    return ServePlan(
        entry=entry,
        options=options,
        plan=plan,
        remember=slot,
        replan=_replanner(settings, entry, survey, replanned),
        replanned=replanned,
    )


def _log_plan(plan: Plan, machine: Inventory) -> None:
    """Serve's start-up lines on the plan: the decision, why, its sampling, the shape and the notes."""
    if (chosen := plan.chosen) is not None:
        loud = " (LAST RESORT: below the context floor)" if plan.last_resort else ""
        log.info("plan%s: %s: %s", loud, chosen.engine, chosen.headline)
        log.info("plan: why: %s", plan.why)
        log.info("plan: %s", chosen.sampling_line)
    if (replication := plan.replication) is not None:  # what serve starts of the replicas: gateway.cli.startup
        log.info("plan: shape: %s", replication.why)
    for note in plan.notes:
        if note not in machine.notes:  # the inventory's own notes were logged when it was read
            log.info("plan: %s", note)


def _replanner(
    settings: Settings,
    entry: ModelEntry,
    survey: Callable[[], Awaitable[Inventory]] | None,
    replanned: list[Callable[[Plan], None]],
) -> Callable[[], Awaitable[tuple[list[Option], dict[str, Any]]]] | None:
    """The plan made again over the nodes ``survey`` finds answering now, each listener in ``replanned``
    told of it; None without other nodes (no ``survey``)."""
    if survey is None:
        return None

    async def replan() -> tuple[list[Option], dict[str, Any]]:
        """Ask the nodes again (on the loop) and plan over what answers (the planning off the loop: it reads
        model files)."""
        assert survey is not None
        fresh = await asyncio.to_thread(plan_for, settings, entry, await survey(), serving=True)
        for listener in replanned:
            listener(fresh)
        return options_of(fresh, settings), plan_summary(fresh)

    return replan
