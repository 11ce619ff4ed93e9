"""`/metrics`: the request metrics of gateway.serving.edge.middleware plus gauges read from live state at scrape time
(queue, backend state and restarts, the plan's figures, GPU memory from NVML when there are GPUs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from gateway.serving.runtime import GpuMemoryNow, Runtime

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
        up.add_metric([node["name"]], 1.0 if node.get("state") == "in use" else 0.0)
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


def live_gpu_memory(labels: frozenset[str]) -> GpuMemoryNow:
    """(gpu, used, total) now from NVML for this machine's GPUs among ``labels`` (the plan's); empty
    without a driver. A local GPU's label is its NVML index, so the two lists name devices alike."""

    def read() -> list[tuple[str, int, int]]:
        from gateway.core.devices import probe_nvml

        gpus, _, _ = probe_nvml()
        return [(g.label, g.total_bytes - g.free_bytes, g.total_bytes) for g in gpus if g.label in labels]

    return read


def endpoint(registry: CollectorRegistry) -> Callable[[Request], Any]:
    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics
