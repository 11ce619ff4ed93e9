"""`/metrics`: the request metrics of gateway.serving.edge.middleware plus gauges read from live state at scrape time
(queue, backend state and restarts, the plan's figures, GPU memory from NVML when there are GPUs).

A scrape must never stall serving: the figures are collected on the event loop (they read live state,
and every label set is bounded), the text is written in a thread, and scrapes that arrive while one is
being written share its answer (:class:`Scrapes`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from gateway.serving.routing.pool import Health, Pool, Why
from gateway.serving.runtime import GpuMemoryNow, Runtime
from gateway.supervision.lifecycle import NodeStatus

STATES = ("starting", "ready", "restarting", "failed", "stopped")


class StateCollector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def collect(self) -> Iterator[Any]:
        admission = self.rt.admission
        yield GaugeMetricFamily("gateway_queue_depth", "Requests waiting for an engine slot", value=admission.queued)
        yield GaugeMetricFamily("gateway_active_requests", "Requests forwarded right now", value=admission.active)
        yield GaugeMetricFamily(
            "gateway_queue_rejections", "Requests refused with 429 so far", value=admission.rejected
        )
        backend = self.rt.backend
        state = GaugeMetricFamily("gateway_backend_state", "1 for the backend's current state", labels=["state"])
        for name in STATES:
            state.add_metric([name], 1.0 if backend.state.value == name else 0.0)
        yield state
        yield GaugeMetricFamily("gateway_backend_restarts", "Engine restarts so far", value=backend.restarts)
        hangs = len(backend.snapshot().get("hangs") or [])
        yield GaugeMetricFamily(
            "gateway_engine_hangs", "Engines found hung (no progress, or a silent canary) and restarted", value=hangs
        )
        context = self.rt.context_length()  # the figure /v1/models gives: the live engine's only once ready
        yield GaugeMetricFamily("gateway_context_length", "Context length served", value=context)
        planned = GaugeMetricFamily(
            "gateway_plan_gpu_memory_bytes", "Planned memory per GPU and term", labels=["gpu", "term"]
        )
        for gpu, term, value in self.rt.plan_memory:
            planned.add_metric([gpu, term], float(value))
        yield planned
        yield GaugeMetricFamily(
            "gateway_plan_kv_tokens", "KV cache tokens the plan expects", value=self.rt.plan_kv_tokens
        )
        used = GaugeMetricFamily("gateway_gpu_memory_used_bytes", "GPU memory in use now (NVML)", labels=["gpu"])
        total = GaugeMetricFamily("gateway_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"])
        for gpu, used_bytes, total_bytes in self.rt.gpu_memory():  # read at scrape time (after a replan too)
            used.add_metric([gpu], float(used_bytes))
            total.add_metric([gpu], float(total_bytes))
        yield used
        yield total
        reported = GaugeMetricFamily(
            "gateway_engine_memory_bytes",
            "Memory per device and term as the live engine logged it",
            labels=["device", "term"],
        )
        live = backend.snapshot().get("backend") or {}
        for device, terms in (live.get("memory_mib") or {}).items():
            for term, mib in terms.items():
                reported.add_metric([device, term], float(mib) * 2**20)
        yield reported
        yield from _node_metrics(backend.snapshot())
        scheduling = self.rt.scheduling_status()
        yield CounterMetricFamily(
            "gateway_prefilled_ahead",
            "Long prompts the gateway prefilled ahead of their requests, to pause them while warm turns run",
            value=scheduling["prefilled_ahead"],
        )
        yield CounterMetricFamily(
            "gateway_prefill_pauses",
            "Times such a prefill was paused while warm turns ran (each one sent again after)",
            value=scheduling["prefill_pauses"],
        )
        if len(self.rt.pool.replicas) > 1:
            yield from _replica_metrics(self.rt.pool)


def _node_metrics(snapshot: dict[str, Any]) -> Iterator[Any]:
    """Per worker node (``serve --workers``): whether it is in use, and how often it was lost."""
    nodes = [node for node in snapshot.get("nodes") or [] if node.get("address")]
    if not nodes:
        return
    up = GaugeMetricFamily(
        "gateway_node_up", "1 while a worker node answers and its devices are in the plan", labels=["node"]
    )
    lost = GaugeMetricFamily(
        "gateway_node_lost", "Times a worker node disappeared while its devices were in use", labels=["node"]
    )
    for node in nodes:
        up.add_metric([node["name"]], 1.0 if node.get("state") == NodeStatus.IN_USE else 0.0)
        lost.add_metric([node["name"]], float(node.get("lost", 0)))
    yield up
    yield lost
    yield GaugeMetricFamily(
        "gateway_replans", "Plans made again over the nodes", value=len(snapshot.get("replans") or [])
    )
    if "group_stops" in snapshot:
        yield GaugeMetricFamily(
            "gateway_group_stops",
            "Engine groups over nodes stopped on every rank because one rank, its node or the engine was gone",
            value=len(snapshot.get("group_stops") or []),
        )


ROUTED = tuple(why for why in Why if why is not Why.ONLY)  # how a request came to its replica, with several


def _replica_metrics(pool: Pool[Any]) -> Iterator[Any]:
    """Per replica, when more than one engine serves the model (labels: the plan's replica and node names, never
    a client's); the pool's totals are the sums (``histogram_quantile`` over the summed TTFT buckets)."""
    shown = pool.snapshot()
    rows = {row["name"]: row for row in shown["replicas"]}
    info = GaugeMetricFamily(
        "gateway_replica_info", "1 per replica: the node and devices it runs on", labels=["replica", "node", "devices"]
    )
    state = GaugeMetricFamily(
        "gateway_replica_state", "1 for each replica's current state", labels=["replica", "state"]
    )
    bound = GaugeMetricFamily(
        "gateway_replica_sessions_bound", "Conversations whose next turn goes to the replica", labels=["replica"]
    )
    queued = GaugeMetricFamily("gateway_replica_queued", "Requests placed on the replica, waiting", labels=["replica"])
    active = GaugeMetricFamily("gateway_replica_active", "Requests in the replica's engine", labels=["replica"])
    warm = GaugeMetricFamily(
        "gateway_replica_warm_share", "Of later turns, the share sent where their cache was", labels=["replica"]
    )
    placed = CounterMetricFamily(
        "gateway_replica_requests",
        "Requests placed on the replica, by why (warm, parent, prefix, least_loaded; moved_load and moved_down"
        " prefill again; retry: another replica failed before the first byte)",
        labels=["replica", "why"],
    )
    failed = CounterMetricFamily(
        "gateway_replica_failed", "Requests that failed on the replica before their first byte", labels=["replica"]
    )
    ttft = HistogramMetricFamily(
        "gateway_replica_ttft_seconds", "Time to the first output, per replica", labels=["replica"]
    )
    for replica in pool.replicas:
        row = rows[replica.name]
        name = [replica.name]
        info.add_metric([replica.name, replica.node, ",".join(replica.devices)], 1.0)
        for health in Health:
            state.add_metric([replica.name, health.value], 1.0 if row["state"] == health.value else 0.0)
        bound.add_metric(name, float(row["sessions_bound"]))
        queued.add_metric(name, float(row["queued"]))
        active.add_metric(name, float(row["active"]))
        if row["warm_share"] is not None:
            warm.add_metric(name, float(row["warm_share"]))
        for why in ROUTED:
            placed.add_metric([replica.name, why.value], float(row[why.value]))
        failed.add_metric(name, float(row["failed"]))
        ttft.add_metric(name, replica.ttft.cumulative(), replica.ttft.sum_s)
    yield from (info, state, bound, queued, active, warm, placed, failed, ttft)
    yield GaugeMetricFamily(
        "gateway_pool_bindings", "Conversations and parents the router remembers", value=shown["totals"]["bindings"]
    )


def live_gpu_memory(labels: frozenset[str]) -> GpuMemoryNow:
    """(gpu, used, total) now from NVML for this machine's GPUs among ``labels`` (the plan's); empty
    without a driver. A local GPU's label is its NVML index, so the two lists name devices alike."""

    def read() -> list[tuple[str, int, int]]:
        from gateway.core.devices import probe_nvml

        gpus, _, _ = probe_nvml()
        return [(g.label, g.total_bytes - g.free_bytes, g.total_bytes) for g in gpus if g.label in labels]

    return read


class _Collected(Collector):
    """Figures already collected, for the exposition writer to format away from the loop."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


class Scrapes:
    """One exposition at a time: the collectors run on the loop (they read state the loop changes), the
    text is formatted in a thread, and a scrape that comes while one is under way gets that one's answer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._pending: asyncio.Future[bytes] | None = None
        self.rendered = 0  # expositions written (scrapes that shared one count once)

    async def text(self) -> bytes:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._render())
        return await asyncio.shield(self._pending)  # a scraper that leaves does not cancel the others' answer

    async def _render(self) -> bytes:
        families = list(self.registry.collect())
        self.rendered += 1
        return await asyncio.to_thread(generate_latest, _Collected(families))


def endpoint(registry: CollectorRegistry) -> Callable[[Request], Any]:
    scrapes = Scrapes(registry)

    async def metrics(_request: Request) -> Response:
        return Response(await scrapes.text(), media_type=CONTENT_TYPE_LATEST)

    return metrics
