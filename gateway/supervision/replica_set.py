"""Several supervised engines that serve one model, seen as the one backend the app fronts.

Each replica keeps its own supervisor (its own options, step-down, fallback, liveness, restarts: one
fate per replica); the set only says what the app asks of one backend: it is ready while any replica
serves, it settles when the first replica is ready (or when every one has given up), and it stops them
all. Which replica a request goes to is the router's (gateway.serving.routing), not the set's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.backends.base import Failure, Launch, Option
from gateway.supervision.lifecycle import EngineTarget, ServedBackend, State


class WithEnv:
    """An engine's option whose process also gets ``env`` (a replica's devices: CUDA_VISIBLE_DEVICES), through
    every step-down and remembered form of it."""

    def __init__(self, option: Option, env: Mapping[str, str]) -> None:
        self.option = option
        self.env = dict(env)

    @property
    def engine(self) -> str:
        return self.option.engine

    @property
    def label(self) -> str:
        return self.option.label

    @property
    def weights_key(self) -> tuple[object, ...]:
        return self.option.weights_key

    @property
    def context_length(self) -> int:
        return self.option.context_length

    @property
    def estimated_tokens_per_s(self) -> float:
        return self.option.estimated_tokens_per_s

    def launch(self, port: int, api_key: str) -> Launch:
        launch = self.option.launch(port, api_key)
        return dataclasses.replace(launch, env={**launch.env, **self.env})

    def classify(self, line: str) -> Failure | None:
        return self.option.classify(line)

    def step_down(self, failure: Failure) -> Option | None:
        lower = self.option.step_down(failure)
        return None if lower is None else with_env(lower, self.env)

    def memo(self) -> dict[str, Any]:
        return self.option.memo()

    def prepare(self) -> Option:
        return with_env(self.option.prepare(), self.env)

    def from_memo(self, memo: dict[str, Any]) -> Option:
        return with_env(self.option.from_memo(memo), self.env)


def with_env(option: Option, env: Mapping[str, str]) -> Option:
    """``option`` as it is where ``env`` adds nothing."""
    return WithEnv(option, env) if env else option


class ReplicaSet:
    """The replicas' backends as one :class:`ServedBackend` (it conforms: gateway.cli.startup checks)."""

    def __init__(self, backends: Sequence[ServedBackend], names: Sequence[str]) -> None:
        if len(backends) < 2 or len(backends) != len(names):
            raise ValueError("a replica set needs two or more backends, each named")
        self.backends = tuple(backends)
        self.names = tuple(names)
        self.retry_at: float | None = None

    def _serving(self) -> list[ServedBackend]:
        return [backend for backend in self.backends if backend.ready]

    @property
    def state(self) -> State:
        """READY while any replica serves; else the most hopeful of theirs (starting, restarting, failed)."""
        states = {backend.state for backend in self.backends}
        for state in (State.READY, State.STARTING, State.RESTARTING, State.FAILED):
            if state in states:
                return state
        return State.STOPPED

    @property
    def reason(self) -> str | None:
        reasons = [f"replica {name}: {b.reason}" for name, b in zip(self.names, self.backends, strict=True) if b.reason]
        return "; ".join(reasons) or None

    @property
    def ever_ready(self) -> bool:
        return any(backend.ever_ready for backend in self.backends)

    @property
    def restarts(self) -> int:
        return sum(backend.restarts for backend in self.backends)

    @property
    def ready(self) -> bool:
        return bool(self._serving())

    @property
    def target(self) -> EngineTarget | None:
        """A serving replica's engine (the replicas of one plan share engine, context and means): what the
        handlers read before a request is placed; the request goes to its own replica's."""
        serving = self._serving() or [b for b in self.backends if b.target is not None]
        return serving[0].target if serving else None

    @property
    def context_length(self) -> int:
        return min(backend.context_length for backend in self.backends)

    async def start(self) -> None:
        for backend in self.backends:
            await backend.start()

    async def wait_settled(self) -> State:
        """Until one replica is ready, or every one has given up (each keeps trying on its own after)."""
        waits = [asyncio.ensure_future(backend.wait_settled()) for backend in self.backends]
        try:
            for settled in asyncio.as_completed(waits):
                if await settled is State.READY:
                    return State.READY
        finally:
            for wait in waits:
                wait.cancel()
        return self.state

    async def stop(self) -> None:
        await asyncio.gather(*(backend.stop() for backend in self.backends))

    def snapshot(self) -> dict[str, Any]:
        """The first serving replica's fields at the top (as one engine shows them), every replica's below."""
        serving = self._serving()
        lead = (serving or list(self.backends))[0]
        return {
            **lead.snapshot(),
            "state": self.state.value,
            "engines": [  # each replica's supervisor, as one engine's shows itself
                {"replica": name, **backend.snapshot()} for name, backend in zip(self.names, self.backends, strict=True)
            ],
        }

    def report(self) -> str:
        return "\n".join(
            f"replica {name}: {backend.report()}" for name, backend in zip(self.names, self.backends, strict=True)
        )
