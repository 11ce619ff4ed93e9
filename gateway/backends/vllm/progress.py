"""What vLLM has done so far, read from its Prometheus ``/metrics`` for the gateway's progress watch.

Read from vLLM's source (0.32): the engine core sends its scheduler's stats with every step, also a
step with no request output, such as one chunk of a long prefill (v1/core/sched/scheduler.py,
``update_from_output``: "We must return the stats even if there are no request outputs this step");
the API server turns them into metrics (v1/metrics/loggers.py). A step of a long prefill allocates
KV blocks (``vllm:kv_cache_usage_perc`` moves); a step that yields tokens raises
``vllm:prompt_tokens_total`` (when a prefill completes), ``vllm:generation_tokens_total`` and the
count of ``vllm:iteration_tokens_total`` (one per step with outputs). The page is served by the API
server process, not the engine core: a hung core leaves it answering with figures that stop moving,
which is what the watch looks for. Its running and waiting gauges are the last step's, stale once the
core hangs, so they never tell the watch that the engine is idle (``busy`` unknown).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.base import Progress

PROGRESS_PATH = "/metrics"

_MOVING = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
)


def metrics_progress(text: str) -> Progress | None:
    """The moving figures, each summed over engines, in a fixed order; None when the page has none of
    them (not vLLM's metrics, or text that is not Prometheus')."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _MOVING:
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except ValueError:
        return None
    if not sums:
        return None
    return Progress(tuple(sums.get(name) for name in _MOVING))
