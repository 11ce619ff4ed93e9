"""A long prefill run ahead of its request, paused while warm turns run (the engine's :class:`PrefillFirst`).

llama-server cannot pause a prompt it is prefilling: every step of a warm turn beside it also carries a
batch of that prompt, so an 8-token answer took 4-7x its time alone beside a cold burst. It does keep what
a cancelled request prefilled, and the same prompt sent again resumes there
(gateway.backends.llamacpp.scheduling). So the gateway prefills a long prompt as a request of its own, one
token streamed with an event per batch, closes it while short turns are in the engine, and sends it again
once their answers are over. The client's own request goes last and finds its prompt
cached. A pause lasts at most as long as the prefill has run (after :data:`GRACE_S`), so a long prompt
still has half the engine under a steady stream of warm turns. A prefill that fails is left to the client's
request, which prefills the prompt itself and meets whatever failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.backends.base import PrefillFirst
from gateway.serving.transport.proxy import EngineClient
from gateway.serving.wire.error_shapes import ApiError
from gateway.supervision.lifecycle import EngineTarget

log = logging.getLogger(__name__)

GRACE_S = 2.0  # a prefill may be paused this long in all before its bound (as long as it has run) applies
MIN_PAUSE_S = 0.25  # a pause begins only if it may last this long (each resume re-sends the prompt)


class Turns(Protocol):
    """The short requests in the engine (gateway.serving.scheduling.admission.ShortTurns)."""

    @property
    def inside(self) -> int: ...

    async def changed(self, within_s: float) -> None: ...


@dataclass(frozen=True)
class Prefilled:
    """What a prefill run ahead found and did: the prompt tokens the engine held before it began (its first
    event's figure; None: not said), and how many times it paused."""

    reused: int | None
    pauses: int


class _Budget:
    """How long the prefill has run and been paused. A pause lasts while the time paused in all is under
    max(time run, grace), and begins only if it may last :data:`MIN_PAUSE_S`: a long prompt keeps at least
    half the engine under a steady stream of warm turns, and is not re-sent every few milliseconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.ran_s = 0.0
        self.paused_s = 0.0
        self._since = clock()

    def pause_left_s(self) -> float:
        """While paused: how much longer the pause may last (0 or less: it is over)."""
        return max(self.ran_s, GRACE_S) - (self.paused_s + self.clock() - self._since)

    def run_left_s(self) -> float:
        """While running: how much longer it must run before a pause may begin (0 or less: it may now)."""
        ran = self.ran_s + self.clock() - self._since
        return self.paused_s + MIN_PAUSE_S - max(ran, GRACE_S)

    def switch(self, running: bool) -> None:
        """The phase that ends: ``running`` True for a run, False for a pause."""
        now = self.clock()
        if running:
            self.ran_s += now - self._since
        else:
            self.paused_s += now - self._since
        self._since = now


async def prefill_first(
    client: EngineClient,
    target: EngineTarget,
    path: str,
    payload: Mapping[str, Any],
    spec: PrefillFirst,
    turns: Turns,
    *,
    first_fields: Mapping[str, Any],
    on_held: Callable[[], None],
    place_again: Callable[[int], Awaitable[Mapping[str, Any]]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Prefilled:
    """Prefill ``payload``'s prompt on ``target`` before the request itself is sent, paused while short turns
    are in the engine. The first sending carries ``first_fields`` (its slot: gateway.serving.transport.long_pin),
    each later one what ``place_again`` (the tokens done so far) reads from the engine: the slot that still
    holds them, or none. ``on_held`` runs once the engine holds a sending (its first event), or once that
    sending is over: the gate a placing closed opens."""
    budget = _Budget(clock)
    base = {name: value for name, value in payload.items() if name not in spec.drop} | dict(spec.fields)
    fields, pauses = dict(first_fields), 0
    reused: list[int] = []  # what the engine held before any of this prefill: its first event's figure
    last = [b""]  # the latest read of the sending under way

    def on_event(chunk: bytes) -> None:
        if not last[0] and not reused:
            figures = spec.progress(chunk)
            reused.append(figures[0] if figures is not None else -1)
        if not last[0]:
            on_held()
        last[0] = chunk

    while True:
        pause = asyncio.ensure_future(_pause_wanted(turns, budget))
        last[0] = b""
        try:
            body = json.dumps(base | fields).encode()
            finished = await client.prefill(target, path, body, until=pause, on_event=on_event)
        except ApiError as exc:
            log.info("prefilling a long prompt ahead of it failed (%s); the request prefills it", exc.message)
            return Prefilled(None, pauses)
        finally:
            pause.cancel()
            on_held()
        budget.switch(running=True)
        if finished:
            return Prefilled(reused[0] if reused and reused[0] >= 0 else None, pauses)
        pauses += 1
        figures = spec.progress(last[0])
        await _resume_when(turns, budget)
        budget.switch(running=False)
        done = figures[1] if figures is not None else 0
        fields = dict(await place_again(done)) if place_again is not None else {}


async def _pause_wanted(turns: Turns, budget: _Budget) -> None:
    """Return once a short turn is in the engine and the budget allows a pause."""
    while True:
        if not turns.inside:
            await turns.changed(3600.0)
        elif (wait := budget.run_left_s()) > 0:
            await turns.changed(wait)  # until the prefill has run long enough to pause again
        else:
            return


async def _resume_when(turns: Turns, budget: _Budget) -> None:
    """Return once no short turn is in the engine, or the pause's budget is spent."""
    while turns.inside and (left := budget.pause_left_s()) > 0:
        await turns.changed(left)
