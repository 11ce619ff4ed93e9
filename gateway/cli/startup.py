"""`serve`'s assembly, in one place: from settings to the ordered options the supervisor will try
(plan first, then make it startable), then the supervisor (or the external backend), the client to
the engine and the app's runtime with the plan's figures. ``gateway.cli.commands`` only runs it.

What is read from disk is read once here: the API keys (the app's, and the first one sent to the
workers) and the remembered configuration (the plan, its measured note and the supervisor's first
option all use the one read).

Each engine turns its own fitting candidates into options (vLLM: its best few rungs, so a failure
has somewhere to step down to; llama.cpp: its best placement); they are tried in the registry's order
of preference. Flags the user gave are pinned: when the plan says they do not fit they are still
tried first (the user asked), with a warning, and the engine's own numbers decide the step down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from backends import registry
from backends.base import Option
from gateway.core.devices import Inventory, inventory, parse_remote_gpus
from gateway.core.errors import BackendError, ConfigError, GatewayError
from gateway.core.model_entry import ModelEntry
from gateway.core.policy import policy_for
from gateway.core.settings import Settings
from gateway.nodes.group import WorkerGroup
from gateway.nodes.survey import Nodes
from gateway.planning.catalog import DEFAULT_MODEL, Catalog, catalog_with
from gateway.planning.planner import EnginePlan, Plan, evaluate_and_choose, read_engines
from gateway.serving.external import ExternalBackend, describe_server
from gateway.serving.metrics import live_gpu_memory
from gateway.serving.model_names import ModelRoute
from gateway.serving.proxy import EngineClient, Timeouts
from gateway.serving.runtime import PlanFigures, PlannedDevice, Runtime
from gateway.remembered.known_good import KnownGood
from gateway.supervision.lifecycle import ServedBackend
from gateway.supervision.liveness import Limits, Liveness
from gateway.remembered.known_good import KnownGoodSlot
from gateway.supervision.supervisor import Supervisor, remembered_first

log = logging.getLogger("gateway.startup")

# After the drain (shutdown_grace_s) the engine gets SIGTERM and this long before SIGKILL: a busy
# engine waits for its generation on SIGTERM, and the drain already gave requests their time.
ENGINE_TERM_WAIT_S = 5.0


@dataclass(frozen=True)
class ServePlan:
    """What the plan gives `serve`: the model, its names, the options to try in order, and how to
    remember what worked (and, with workers, how to plan again)."""

    entry: ModelEntry
    route: ModelRoute
    options: list[Option]
    plan: Plan
    remember: KnownGoodSlot
    nodes: Nodes | None = None  # the workers (--workers), when there are any
    # the plan made again over the workers that answer now: its options and summary (for the supervisor)
    replan: Callable[[], tuple[list[Option], dict[str, Any]]] | None = field(default=None, compare=False)
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


def worker_key(settings: Settings, keys: tuple[str, ...]) -> str | None:
    """What the head sends its workers: worker_api_key, else its own first key (``keys``: as read once)."""
    return settings.worker_api_key or (keys[0] if keys else None)


def with_other_nodes(
    machine: Inventory, settings: Settings, remote_spec: str | None = None, nodes: Nodes | None = None
) -> Inventory:
    """This machine plus the other nodes' devices: simulated (``--remote-gpus``), else what the workers
    report now (``--workers``; one that does not answer is left out, and the notes say so)."""
    if remote_spec:
        remote = parse_remote_gpus(remote_spec)
        names = sorted({g.node for g in remote})
        return replace(machine, remote=remote, notes=(*machine.notes, f"simulated devices on {', '.join(names)}"))
    if nodes is None and settings.workers:
        nodes = Nodes(settings.workers, worker_key(settings, settings.read_api_keys()))
    return nodes.survey(machine) if nodes is not None else machine


def plan_serving(
    settings: Settings, keys: tuple[str, ...] = (), catalog: Catalog | None = None, machine: Inventory | None = None
) -> ServePlan:
    """Plan what `serve` starts: the model, every engine's options in the order they are tried (the
    remembered configuration first), and how to remember what worked. ``keys``: the API keys as read
    once (the first is sent to the workers unless worker_api_key is set)."""
    catalog = catalog or catalog_with(settings.catalog_dir)
    local = machine or inventory(settings.gpus, settings.ram)
    nodes = Nodes(settings.workers, worker_key(settings, keys)) if settings.workers else None
    machine = with_other_nodes(local, settings, nodes=nodes)
    entry = choose_model(settings, catalog, len(machine.gpus))
    store = KnownGood(settings.state_dir)
    remembered = store.get(entry.name, machine.fingerprint)  # the one read: plan, note and first option
    if remembered and not (settings.replan or settings.files_pinned()):  # e.g. a pinned quantization (--quant)
        # e.g. the hub variant that worked here: no new search (a pinned --quant searches again)
        plan, entry, remembered = _plan_remembered(settings, entry, machine, remembered, store)
    else:
        plan = plan_given(settings, entry, machine, serving=True, remembered=remembered)
    if (chosen := plan.chosen) is not None:
        loud = " (LAST RESORT: below the context floor)" if plan.last_resort else ""
        log.info("plan%s: %s: %s", loud, chosen.engine, chosen.headline)
        log.info("plan: why: %s", plan.why)
    for note in plan.notes:
        if note not in machine.notes:  # the inventory's own notes were logged when it was read
            log.info("plan: %s", note)
    options = options_of(plan, settings)
    if not options:
        raise nothing_to_start(entry, plan)
    remember = KnownGoodSlot(
        store=store,
        model=entry.name,
        fingerprint=machine.fingerprint,
        versions={e.backend.name: e.backend.memo_version(e.installation) for e in plan.engines},
    )
    if not settings.replan:
        # a memo that cannot be rebuilt is set aside, unless a pinned --quant is why it does not fit
        set_aside = None if settings.files_pinned() else partial(store.set_aside, entry.name, machine.fingerprint)
        options = remembered_first(options, remember, remembered, lambda memo: _rebuild(options, memo, set_aside))
    route = ModelRoute(fronted=entry.name, served=entry.name, aliases=entry.aliases)

    replanned: list[Callable[[Plan], None]] = []

    def replan() -> tuple[list[Option], dict[str, Any]]:
        """Ask the workers again and plan over what answers (blocking: run it off the loop)."""
        assert nodes is not None
        fresh = plan_for(settings, entry, nodes.survey(local), serving=True)
        for listener in replanned:
            listener(fresh)
        return options_of(fresh, settings), plan_summary(fresh)

    return ServePlan(
        entry=entry,
        route=route,
        options=options,
        plan=plan,
        remember=remember,
        nodes=nodes,
        replan=replan if nodes is not None else None,
        replanned=replanned,
    )


# what a malformed memo raises inside an engine's reading of it (a hand-edited or older file)
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def _plan_remembered(
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
    except _MALFORMED as exc:
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


def _rebuild(
    options: list[Option], entry: dict[str, Any], set_aside: Callable[[str], None] | None = None
) -> Option | None:
    """The remembered configuration, on top of the current option of the same engine; one with a
    malformed field (a hand-edited or old file) is set aside (or, without ``set_aside``, ignored) with a
    warning, found by building its command line now rather than when the engine is launched."""
    for option in options:
        if option.engine == entry.get("engine"):
            try:
                rebuilt = option.from_memo(entry["memo"])
                rebuilt.launch(0, "check")
                _ = rebuilt.label
            except _MALFORMED as exc:
                why = f"{type(exc).__name__}: {exc}"
                if set_aside is not None:
                    set_aside(f"cannot be rebuilt ({why})")
                else:
                    log.warning("ignoring the remembered configuration (%s): planning afresh, as --replan would", why)
                return None
            return rebuilt
    return None


@dataclass(frozen=True)
class Serving:
    """What `serve` runs: the app's runtime, and the supervisor when the gateway starts the engine."""

    runtime: Runtime
    supervisor: Supervisor | None  # None: --backend-url (a server the user runs)
    fronted: str


def assemble(settings: Settings, machine: Inventory | None = None) -> Serving:
    """Everything `serve` runs, from its settings: the plan and its supervisor (or the server at
    --backend-url), the client to the engine and the app's runtime with the plan's figures. The API
    keys are read here once (an empty key or a key file without one is refused before anything starts);
    ``machine``: this machine's devices, when the caller read them."""
    keys = settings.read_api_keys()
    timeouts = Timeouts(
        connect_s=settings.connect_timeout_s,
        first_byte_s=settings.first_byte_timeout_s,
        stream_idle_s=settings.stream_idle_timeout_s,
        answer_s=settings.request_timeout_s,
    )
    client = EngineClient(timeouts, max_answer_bytes=settings.max_answer_bytes)
    if settings.backend_url:  # the served name, context and capacity come from the server itself
        launch, fronted = describe_server(settings)
        external: ServedBackend = ExternalBackend(launch)  # mypy checks that it conforms
        route = ModelRoute(fronted=fronted, served=launch.served_name)
        return Serving(_runtime(settings, route, external, client, keys), None, fronted)
    serve_plan = plan_serving(settings, keys, machine=machine)
    supervisor = Supervisor(
        serve_plan.options,
        log_dir=settings.backend_log_dir,
        startup_timeout_s=settings.startup_timeout_s,
        shutdown_grace_s=ENGINE_TERM_WAIT_S,
        remember=serve_plan.remember,
        plan_summary=plan_summary(serve_plan.plan),
        replan=serve_plan.replan,
        nodes=serve_plan.nodes,
        group=WorkerGroup(serve_plan.nodes) if serve_plan.nodes is not None else None,
        liveness=Liveness(
            Limits(stall_s=settings.stall_timeout_s, canary_s=settings.canary_interval_s),
            activity=client.activity,
            end_requests=client.cut,
        ),
    )
    for number, option in enumerate(serve_plan.options, 1):
        log.info("option %d of %d: %s", number, len(serve_plan.options), option.label)
    runtime = _runtime(settings, serve_plan.route, supervisor, client, keys)
    runtime.show_plan(plan_figures(serve_plan.plan))
    # a plan made again (a node lost or back) replaces the first one on /status and /metrics
    serve_plan.replanned.append(lambda fresh: runtime.show_plan(plan_figures(fresh)))
    return Serving(runtime, supervisor, serve_plan.route.fronted)


def _runtime(
    settings: Settings, route: ModelRoute, backend: ServedBackend, client: EngineClient, keys: tuple[str, ...]
) -> Runtime:
    """The app's runtime: what the settings decide about limits and keys, for either kind of backend."""
    return Runtime(
        route=route,
        backend=backend,
        engine_client=client,
        max_body_bytes=settings.max_body_bytes,
        max_body_elements=settings.max_body_elements,
        queue_limit=settings.queue_limit,
        per_key_limit=settings.max_inflight_per_key,
        queue_wait_s=settings.queue_wait_s,
        api_keys=keys,
        bind_host=settings.host,
        allowed_hosts=tuple(settings.allowed_hosts),
        cors_allow_origins=tuple(settings.cors_allow_origins),
    )


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
