"""What the HTTP app serves, in one value: the route, the backend behind it, the client to it, the
limits in front of it. Its own module so that the app, the handlers and ``/metrics`` all import it
without importing each other."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.admission import Admission
from gateway.lifecycle import ServedBackend
from gateway.proxy import Upstream
from gateway.routing import ModelRoute


@dataclass
class Runtime:
    """One model route, its backend (supervised or external), the client to it and the admission
    queue in front of it."""

    route: ModelRoute
    backend: ServedBackend
    upstream: Upstream
    max_body_bytes: int
    max_body_elements: int = 100_000
    queue_limit: int = 64
    queue_wait_s: float = 600.0
    api_keys: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"  # with allowed_hosts: the Host names accepted without keys (browser_guard)
    allowed_hosts: tuple[str, ...] = ()
    cors_allow_origins: tuple[str, ...] = ()
    plan_memory: list[tuple[int, str, int]] = field(default_factory=list)  # (gpu, term, bytes) for /metrics
    plan_kv_tokens: int = 0
    plan_details: dict[str, Any] = field(default_factory=dict)  # candidates for the status page
    gpu_memory: Callable[[], list[tuple[int, int, int]]] = lambda: []
    on_startup_failure: Callable[[], None] = lambda: None
    created: int = 0
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.created = int(time.time())
        self.admission = Admission(self.capacity, queue_limit=self.queue_limit, wait_s=self.queue_wait_s)

    def capacity(self) -> int:
        """Requests the live engine runs at once (it changes when the engine restarts or steps down)."""
        launch = self.backend.launch
        return launch.max_concurrency if launch else 1

    def context_length(self) -> int:
        """What the live engine was started with; the route's figure while none is ready."""
        launch = self.backend.launch
        return launch.context_length if launch and self.backend.ready else self.route.context_length
