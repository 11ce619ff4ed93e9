"""What the HTTP app serves, in one value: the route, the backend behind it, the client to it, the
limits in front of it. Its own module so that the app, the handlers and ``/metrics`` all import it
without importing each other."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.routing.pool import Balance, Health, Pool, Replica
from gateway.serving.scheduling.admission import Admission
from gateway.serving.scheduling.sessions import KnownPrefixes
from gateway.serving.scheduling.usage_board import UsageBoard
from gateway.serving.transport.proxy import EngineClient
from gateway.supervision.lifecycle import ServedBackend, State

# Every ``gpu`` below is a device's label (gateway.core.devices.Device.label): its index on its own node as
# NVML numbers it ("node2/0" for another node's), never a position in an engine's device order.
GpuMemoryNow = Callable[[], list[tuple[str, int, int]]]  # (gpu, used bytes, total bytes) read now


@dataclass(frozen=True)
class PlannedDevice:
    """One device the plan places the model on, as /status lists it."""

    gpu: str
    name: str
    total_bytes: int
    planned_bytes: int


@dataclass(frozen=True)
class PlanFigures:
    """What /metrics and the status page show of the plan the backend runs."""

    plan_memory: list[tuple[str, str, int]]  # (gpu, term, bytes)
    plan_kv_tokens: int
    plan_details: dict[str, Any]  # candidates for the status page
    devices: tuple[PlannedDevice, ...] = ()  # the devices the plan uses (simulated ones too)
    # the memory in use now on those of them that are this machine's real GPUs (NVML); None: none are
    gpu_memory: GpuMemoryNow | None = None


def health_of(state: State) -> Health:
    """A supervised backend's state as a replica's: serving, on its way, or not."""
    if state is State.READY:
        return Health.UP
    return Health.STARTING if state in (State.STARTING, State.RESTARTING) else Health.DOWN


@dataclass(frozen=True)
class Engine:
    """One replica's engine as ``serve`` starts it: its supervised backend and its own HTTP client (a hang
    cut through one client ends that replica's requests only), where it runs."""

    name: str
    backend: ServedBackend
    client: EngineClient
    node: str = ""  # "" this machine
    devices: tuple[str, ...] = ()


class Upstream(Protocol):
    """What a request placed on a replica is sent through: its backend, its client, its own admission (its
    slots, warm-before-cold and long lane; the per-key counts are the pool's, one count for all)."""

    @property
    def backend(self) -> ServedBackend: ...
    @property
    def client(self) -> EngineClient: ...
    @property
    def admission(self) -> Admission: ...


@dataclass(frozen=True)
class ReplicaUpstream:
    """A replica's: fixed when serve starts it."""

    backend: ServedBackend
    client: EngineClient
    admission: Admission


class OwnUpstream:
    """The one engine's: the runtime's own fields, read at each request (whoever set them last)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @property
    def backend(self) -> ServedBackend:
        return self.runtime.backend

    @property
    def client(self) -> EngineClient:
        return self.runtime.engine_client

    @property
    def admission(self) -> Admission:
        return self.runtime.admission


@dataclass
class Runtime:
    """One model route, its backend (supervised or external), the client to it and the admission
    queue in front of it."""

    route: ModelRoute
    backend: ServedBackend
    engine_client: EngineClient  # the pooled HTTP client to the backend (prompts are counted through it)
    max_body_bytes: int
    max_body_elements: int = 100_000
    queue_limit: int = 64
    queue_wait_s: float = 600.0
    per_key_limit: int = 0  # requests in flight per API key (0: no cap)
    # long prompts prefilled ahead and paused while warm turns run, where the engine can (llama-server)
    pause_long_prefills: bool = False
    api_keys: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"  # with allowed_hosts: the Host names accepted without keys (browser_guard)
    allowed_hosts: tuple[str, ...] = ()
    cors_allow_origins: tuple[str, ...] = ()
    plan_memory: list[tuple[str, str, int]] = field(default_factory=list)  # (gpu, term, bytes) for /metrics
    plan_kv_tokens: int = 0
    plan_details: dict[str, Any] = field(default_factory=dict)  # candidates for the status page
    plan_devices: tuple[PlannedDevice, ...] = ()
    gpu_memory: GpuMemoryNow = lambda: []
    on_startup_failure: Callable[[], None] = lambda: None
    created: int = 0
    admission: Admission = field(init=False)
    usage: UsageBoard = field(default_factory=UsageBoard)  # who uses the node: per key and session
    prefixes: KnownPrefixes = field(default_factory=KnownPrefixes)  # what the engine's prefix cache likely holds
    balance: Balance = field(default_factory=Balance)  # when a conversation leaves its replica for load (settings)
    # the replicas serving the model: today one, the backend above (gateway.serving.routing; never asked with one)
    pool: Pool[Upstream] = field(init=False)
    # the replicas' engines when serve starts several (``backend`` is then the set of them); () : the one above
    engines: tuple[Engine, ...] = ()

    def __post_init__(self) -> None:
        self.created = int(time.time())
        by_key: Counter[str] = Counter()  # requests in flight per key over the whole pool (fairness, the cap)
        admissions: list[Admission] = []  # the pool's, asked again when a slot frees on any of them
        if not self.engines:
            self.admission = self._admission(self.capacity, self.long_lane, by_key, admissions)
            backend = self.backend
            local: Replica[Upstream] = Replica(
                "local",
                OwnUpstream(self),
                health=lambda: health_of(backend.state),
                generation=lambda: backend.restarts,
                prefixes=self.prefixes,
            )
            self.pool = Pool([local], balance=self.balance)
            return
        replicas = [self._replica(engine, by_key, admissions) for engine in self.engines]
        self.admission = replicas[0].upstream.admission
        self.pool = Pool(replicas, balance=self.balance)

    def _admission(
        self, capacity: Callable[[], int], long_lane: Callable[[], int], by_key: Counter[str], pool: list[Admission]
    ) -> Admission:
        return Admission(
            capacity,
            queue_limit=self.queue_limit,
            wait_s=self.queue_wait_s,
            per_key_limit=self.per_key_limit,
            long_lane=long_lane,
            by_key=by_key,
            pool=pool,
        )

    def _replica(self, engine: Engine, by_key: Counter[str], admissions: list[Admission]) -> Replica[Upstream]:
        backend = engine.backend
        return Replica(
            engine.name,
            ReplicaUpstream(
                backend,
                engine.client,
                self._admission(lambda: _capacity(backend), lambda: _long_lane(backend), by_key, admissions),
            ),
            node=engine.node,
            devices=engine.devices,
            health=lambda: health_of(backend.state),
            generation=lambda: backend.restarts,
        )

    @property
    def upstreams(self) -> list[Upstream]:
        """Every engine requests go to (one, or each replica's)."""
        return [replica.upstream for replica in self.pool.replicas]

    def show_plan(self, figures: PlanFigures) -> None:
        """The plan the backend runs now (the first, or one made again when a node was lost or came back)."""
        self.plan_memory = figures.plan_memory
        self.plan_kv_tokens = figures.plan_kv_tokens
        self.plan_details = figures.plan_details
        self.plan_devices = figures.devices
        self.gpu_memory = figures.gpu_memory or (lambda: [])

    def capacity(self) -> int:
        """Requests the live engine runs at once (it changes when the engine restarts or steps down)."""
        return _capacity(self.backend)

    def long_lane(self) -> int:
        """Long prefills the live engine runs at once without starving warm turns (0: no limit)."""
        return _long_lane(self.backend)

    def scheduling_status(self) -> dict[str, Any]:
        """For /status: how requests are scheduled now."""
        target = self.backend.target
        admission = self.admission
        return {
            "engine": target.scheduling.means if target else None,
            "capacity": self.capacity(),
            "active": admission.active,
            "queued": admission.queued,
            "long_prefills_active": admission.long_active,
            "long_lane": self.long_lane(),
            "per_key_limit": self.per_key_limit or None,
            # long prompts prefilled ahead of their requests, and their pauses for warm turns (every replica)
            "prefilled_ahead": sum(upstream.admission.prefilled_ahead for upstream in self.upstreams),
            "prefill_pauses": sum(upstream.admission.prefill_pauses for upstream in self.upstreams),
        }

    def context_length(self) -> int:
        """The one context figure (/v1/models, /status, /metrics): the backend's (see ServedBackend)."""
        return self.backend.context_length


def _capacity(backend: ServedBackend) -> int:
    target = backend.target
    return target.max_concurrency if target else 1


def _long_lane(backend: ServedBackend) -> int:
    target = backend.target
    return target.scheduling.long_lane if target else 0
