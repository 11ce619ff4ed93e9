"""Each replica's time to first output, kept in bounded memory: a histogram since the gateway started (for
``/metrics``, where ``histogram_quantile`` adds the replicas up) and the latest answers (for ``/status``'s
p95, which should say how the replica answers now, not averaged over its whole uptime)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

# the buckets of gateway_time_to_first_token_seconds (gateway.serving.edge.middleware): one scale for both
TTFT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
RECENT = 512  # the latest first outputs a replica's p95 is taken over


class TtftRecord:
    def __init__(self, buckets: Iterable[float] = TTFT_BUCKETS, recent: int = RECENT) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # per bucket, not cumulative; the last one is +Inf
        self.sum_s = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=recent)

    def observe(self, seconds: float) -> None:
        index = next((i for i, bound in enumerate(self.buckets) if seconds <= bound), len(self.buckets))
        self.counts[index] += 1
        self.sum_s += seconds
        self.count += 1
        self.recent.append(seconds)

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus writes them: (upper bound, answers at or under it), ending with +Inf."""
        bounds = [*(str(bound) for bound in self.buckets), "+Inf"]
        running = 0
        rows = []
        for bound, count in zip(bounds, self.counts, strict=True):
            running += count
            rows.append((bound, float(running)))
        return rows

    def p95(self) -> float | None:
        return p95_of(self.recent)


def p95_of(samples: Iterable[float]) -> float | None:
    """The nearest-rank 95th percentile, rounded to the millisecond; None without samples."""
    ordered = sorted(samples)
    if not ordered:
        return None
    return round(ordered[math.ceil(0.95 * len(ordered)) - 1], 3)
