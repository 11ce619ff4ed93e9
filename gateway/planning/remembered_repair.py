"""The remembered configuration in `serve`'s plan: planned from, rebuilt on top of the current option,
tried first; set aside where it no longer holds.

A remembered configuration is input that may have gone bad (a hand-edited or older file, a hub repo
that is gone): where it no longer reads, rebuilds or plans, it is set aside with a warning (the store
says where) and the plan is made afresh, as ``--replan`` would. It must never turn a model that fits
into "nothing fits", nor stop `serve` with a bug message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.backends.base import Option
from gateway.core.devices import Inventory
from gateway.core.errors import GatewayError
from gateway.core.model_entry import ModelEntry
from gateway.core.settings import Settings
from gateway.planning.from_settings import plan_given
from gateway.planning.planner import Plan
from gateway.remembered.known_good import KnownGood, KnownGoodSlot

log = logging.getLogger("gateway.startup")  # serve's start-up lines, under one name

# what a malformed memo raises inside an engine's reading of it (a hand-edited or older file)
MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def plan_remembered(
    settings: Settings, entry: ModelEntry, machine: Inventory, known: dict[str, Any], store: KnownGood
) -> tuple[Plan, ModelEntry, dict[str, Any] | None]:
    """The plan from the remembered configuration (e.g. the hub variant that worked here: no new search),
    the entry it was made from, and the remembered configuration unless it was set aside; where it no
    longer holds, the plan made afresh, and the remembered configuration set aside.

    It no longer holds when reading it fails (a memo of the wrong shape: set aside at once), or when its
    engine finds nothing that fits from it where a fresh plan does (its hub repo is gone, the files
    changed): a remembered configuration must not turn a model that fits into "nothing fits"."""
    remembered = entry.model_copy(update={"remembered": known})
    try:
        plan = plan_given(settings, remembered, machine, serving=True, remembered=known)
    except MALFORMED as exc:
        store.set_aside(entry.name, machine.fingerprint, f"unreadable ({type(exc).__name__}: {exc})")
        return plan_given(settings, entry, machine, serving=True, remembered=None), entry, None
    except GatewayError as exc:
        why = f"unusable ({exc})"
    else:
        engine = plan.engine(str(known["engine"]))
        planned = engine is not None and engine.model is not None and plan.policy.plans(engine.backend.name)
        if not planned or engine is None or engine.best is not None:
            return plan, remembered, known  # it plans (or its engine is not planned this time: kept for later)
        why = f"no longer planned ({plan.decision_reason})"
    fresh = plan_given(settings, entry, machine, serving=True, remembered=known)
    if fresh.chosen is None:  # kept when nothing fits either way (a busy GPU is no reason to forget)
        return fresh, entry, known
    store.set_aside(entry.name, machine.fingerprint, why)
    return fresh, entry, None


def rebuilt(
    options: list[Option], entry: dict[str, Any], set_aside: Callable[[str], None] | None = None
) -> Option | None:
    """The remembered configuration, on top of the current option of the same engine; one with a
    malformed field (a hand-edited or old file) is set aside (or, without ``set_aside``, ignored) with a
    warning, found by the engine's reading of it (``Option.from_memo`` checks every field it takes), not
    by a launch: the command line is built once, when the option is started."""
    for option in options:
        if option.engine == entry.get("engine"):
            try:
                return option.from_memo(entry["memo"])
            except MALFORMED as exc:
                why = f"{type(exc).__name__}: {exc}"
                if set_aside is not None:
                    set_aside(f"cannot be rebuilt ({why})")
                else:
                    log.warning("ignoring the remembered configuration (%s): planning afresh, as --replan would", why)
                return None
    return None


def remembered_first(
    options: list[Option],
    slot: KnownGoodSlot | None,
    entry: dict[str, Any] | None,
    rebuild: Callable[[dict[str, Any]], Option | None],
) -> list[Option]:
    """Put the remembered configuration (``entry``, read by the caller once) first when the engine
    version still matches; an option of the plan that is the same configuration is not tried a second
    time after it."""
    if slot is None or not entry or slot.versions.get(entry.get("engine", "")) != entry.get("version"):
        return options
    option = rebuild(entry)
    if option is None:
        return options
    log.info("using the configuration remembered on %s: %s", entry.get("when"), option.label)
    return [option, *(o for o in options if (o.engine, o.memo()) != (option.engine, option.memo()))]
