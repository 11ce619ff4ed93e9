"""A long prefill run ahead of its request, paused while warm turns run (the engine's :class:`PrefillFirst`;
on with the ``pause_long_prefills`` setting).

llama-server cannot pause a prompt it is prefilling: every step of a warm turn beside it also carries a
batch of that prompt, so an 8-token answer took 4-7x its time alone beside a cold burst. It does keep what
a cancelled request prefilled, and the same prompt sent again resumes there
(gateway.backends.llamacpp.scheduling). So the gateway prefills a long prompt as a request of its own, one
token streamed with an event per batch, closes it while short turns are in the engine, and sends it again
once their answers are over, to the slot that still holds what it did where the engine's page shows one.
The client's own request goes last and finds its prompt cached. A pause lasts at most as long as the
prefill has run (after :data:`GRACE_S`), so a long prompt still has half the engine under a steady stream
of warm turns. A prefill that fails is left to the client's request, which prefills the prompt itself and
meets whatever failed.
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
MIN_RUN_S = 1.0  # a resumed prefill runs this long before it pauses again (the resend costs its tokenizing)


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
    max(time run, grace), and begins only if it may last :data:`MIN_PAUSE_S` and, once resumed, after
    :data:`MIN_RUN_S`: a long prompt keeps at least half the engine under a steady stream of warm turns, and
    is not re-sent every few hundred milliseconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.ran_s = 0.0
        self.paused_s = 0.0
        self._since = clock()

    def pause_left_s(self) -> float:
        """While paused: how much longer the pause may last (0 or less: it is over)."""
        return max(self.ran_s, GRACE_S) - (self.paused_s + self.clock() - self._since)

    def run_left_s(self) -> float:
        """While running: how much longer it must run before a pause may begin (0 or less: it may now); once
        it has paused, each run lasts :data:`MIN_RUN_S` at least."""
        running = self.clock() - self._since
        left = self.paused_s + MIN_PAUSE_S - max(self.ran_s + running, GRACE_S)
        return max(left, MIN_RUN_S - running) if self.paused_s else left

    def switch(self, running: bool) -> None:
        """The phase that ends: ``running`` True for a run, False for a pause."""
        now = self.clock()
        if running:
            self.ran_s += now - self._since
        else:
            self.paused_s += now - self._since
        self._since = now


class _Sending:
    """One sending's reads: its first event (what the engine held; whether what is left is worth a pause)
    and its latest (how far it got)."""

    def __init__(self, spec: PrefillFirst, on_held: Callable[[], None], worth_pausing: int) -> None:
        self.spec, self.on_held, self.worth_pausing = spec, on_held, worth_pausing
        self.first = asyncio.Event()
        self.opening: tuple[int, int, int] | None = None  # (total, held, done) at its first event
        self.last = b""

    def on_event(self, chunk: bytes) -> None:
        if not self.first.is_set():
            self.opening = self.spec.progress(chunk)
            self.on_held()
            self.first.set()
        self.last = chunk

    @property
    def pausable(self) -> bool:
        """Whether what the engine has left of the prompt is worth a pause (a prompt the gateway took for long
        that the engine mostly holds, a subagent's, is done in a moment: paused, it would hold the slot
        where its siblings' conversation is)."""
        return self.opening is None or self.opening[0] - self.opening[1] > self.worth_pausing

    def done(self) -> int:
        """The prompt tokens its slot held when it was closed (0: not said)."""
        figures = self.spec.progress(self.last)
        return figures[2] if figures is not None else 0


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
    worth_pausing: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> Prefilled:
    """Prefill ``payload``'s prompt on ``target`` before the request itself is sent, paused while short turns
    are in the engine and more than ``worth_pausing`` of its tokens are left to prefill. The first sending
    carries ``first_fields`` (its slot: gateway.serving.transport.long_pin), each later one what
    ``place_again`` (the tokens done so far) reads from the engine: the slot that still holds them, or none.
    ``on_held`` runs once the engine holds a sending (its first event), or once that sending is over: the
    gate a placing closed opens."""
    budget = _Budget(clock)
    base = {name: value for name, value in payload.items() if name not in spec.drop} | dict(spec.fields)
    fields, pauses = dict(first_fields), 0
    reused: int | None = None  # what the engine held before any of this prefill: the first sending's figure
    while True:
        sending = _Sending(spec, on_held, worth_pausing)
        pause = asyncio.ensure_future(_pause_wanted(turns, budget, sending))
        try:
            body = json.dumps(base | fields).encode()
            finished = await client.prefill(target, path, body, until=pause, on_event=sending.on_event)
        except ApiError as exc:
            log.info("prefilling a long prompt ahead of it failed (%s); the request prefills it", exc.message)
            return Prefilled(reused, pauses)
        finally:
            pause.cancel()
            on_held()
        if pauses == 0 and sending.opening is not None:
            reused = sending.opening[1]
        budget.switch(running=True)
        if finished:
            return Prefilled(reused, pauses)
        pauses += 1
        await _resume_when(turns, budget)
        budget.switch(running=False)
        fields = dict(await place_again(sending.done())) if place_again is not None else {}


async def _pause_wanted(turns: Turns, budget: _Budget, sending: _Sending) -> None:
    """Return once the sending is held, worth a pause, a short turn is in the engine and the budget allows."""
    await sending.first.wait()
    if not sending.pausable:
        await asyncio.Event().wait()  # never: it runs to its end
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
