"""The supervisor's moves, decided from the option, the failure and the queue alone (no side effects).

:func:`next_move` after a failed start, :func:`restart_move` after a death while serving; the
:class:`~gateway.supervision.supervisor.Supervisor` only carries them out, so every transition has a fast test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.backends.base import Failure, FailureKind, Option

MAX_RESTARTS = 5  # restarts within RESTART_WINDOW_S before the long retries
RESTART_WINDOW_S = 600.0
RESTART_RETRY_S = 30.0  # the first try after giving up; doubles per failed try, up to the window


@dataclass(frozen=True)
class Retry:
    """Start ``option`` next (the failed one on the engine's numbers, or the same one again)."""

    option: Option
    rest: tuple[Option, ...]  # the queue after it

    @property
    def queue(self) -> tuple[Option, ...]:
        return (self.option, *self.rest)

    def describe(self, failed: Option) -> str:
        return f"retrying on the engine's numbers: {self.option.label}"


@dataclass(frozen=True)
class NextOption:
    """Go on with ``queue``; ``ruled_out`` are the queued options the failure proved pointless."""

    queue: tuple[Option, ...]
    ruled_out: tuple[Option, ...] = ()

    def describe(self, failed: Option) -> str:
        if not self.queue:
            return "no option left"
        switch = self.queue[0].engine != failed.engine
        return f"{'falling back to' if switch else 'next rung:'} {self.queue[0].label}"


@dataclass(frozen=True)
class Stop:
    """A configuration failure: retrying cannot help, the user must apply ``fix``."""

    reason: str
    fix: str

    @property
    def queue(self) -> tuple[Option, ...]:
        return ()

    def describe(self, failed: Option) -> str:
        return f"stopped: a configuration error ({self.fix})"


@dataclass(frozen=True)
class Replan:
    """A device on another node is gone: ask the workers again and plan over what answers (more
    layers in RAM); after a death while serving, restart ``number`` after ``delay_s``."""

    reason: str
    delay_s: float = 0.0
    number: int = 0

    @property
    def queue(self) -> tuple[Option, ...]:
        return ()

    def describe(self, failed: Option) -> str:
        return f"re-planning over the nodes that answer ({self.reason})"


Move = Retry | NextOption | Stop | Replan


def next_move(option: Option, failure: Failure | None, queue: Sequence[Option], *, can_replan: bool = False) -> Move:
    """The move after ``option`` failed to start with ``failure`` (None: no line said why), ``queue``
    being the options still to try; the move carries the queue that follows. ``can_replan``: the plan
    pools other nodes' devices and can be made again without the one that does not answer."""
    rest = tuple(queue)
    if failure is None:
        return NextOption(rest)
    kind = failure.kind
    if kind is FailureKind.DEVICE_UNREACHABLE and can_replan:
        return Replan(kind.value)
    if kind.is_configuration:
        return Stop(reason=f"{option.label}: {kind.value}; fix: {failure.fix}", fix=failure.fix)
    if kind.is_memory:
        if adjusted := option.step_down(failure):
            return Retry(adjusted, rest)
        if kind is FailureKind.WEIGHTS_OOM:  # every option loading the same weights per device fails alike
            return _without(rest, lambda other: other.weights_key == option.weights_key)
        return NextOption(rest)
    if kind is FailureKind.PORT_IN_USE:  # taken between choosing the port and binding it: not the option's fault
        return Retry(option, rest)
    if kind is FailureKind.ENGINE_FAILED:  # this engine cannot run it here: skip to the other, if any
        move = _without(rest, lambda other: other.engine == option.engine)
        return move if move.queue else NextOption(rest)
    return NextOption(rest)


def _without(queue: tuple[Option, ...], ruled_out: Callable[[Option], bool]) -> NextOption:
    return NextOption(
        tuple(other for other in queue if not ruled_out(other)), tuple(other for other in queue if ruled_out(other))
    )


@dataclass(frozen=True)
class RestartBudget:
    """How many restarts a serving engine gets within how long, and how it is tried after that.

    At most ``limit`` restarts within any ``window_s`` (settings ``restart_limit``, ``restart_window_s``):
    an engine that keeps dying is not restarted in a tight loop for ever. Past that the supervisor gives
    up restarting it at its short backoff, but never for good: it tries again ``retry_s`` later, doubling
    the wait after each try that fails, up to ``window_s`` (``restart_retry_s``), and serves again once a
    try starts. Before this budget the count was never reset: a fifth death in any uptime, days apart,
    gave up for good while the process lived on answering 503."""

    limit: int = MAX_RESTARTS
    window_s: float = RESTART_WINDOW_S
    retry_s: float = RESTART_RETRY_S

    def retry_delay(self, tries: int) -> float:
        """The wait before try ``tries`` + 1 after giving up: ``retry_s`` doubled per try so far, capped."""
        return min(self.retry_s * 2.0 ** min(tries, 64), max(self.window_s, self.retry_s))


@dataclass(frozen=True)
class Restart:
    """Restart number ``number`` (within the budget's window): start ``option`` after waiting ``delay_s``."""

    option: Option
    delay_s: float
    number: int


@dataclass(frozen=True)
class GiveUp:
    """Restarting at the short backoff is over: ``reason``; ``retry`` (when given) is the try that follows,
    after its own long wait."""

    reason: str
    retry: Restart | Replan | None = None


def restart_move(
    live: Option,
    failure: Failure | None,
    options: Sequence[Option],
    restarts: int,
    backoff_s: Sequence[float],
    *,
    can_replan: bool = False,
    budget: RestartBudget | None = None,
    tries: int | None = None,
) -> Restart | GiveUp | Replan:
    """After the serving engine (``live``, one of ``options``) died with ``failure`` and ``restarts``
    restarts within the budget's window so far: the same option again, or the next one when it ran out
    of memory (it would again), after the backoff for this restart. When the plan pools other nodes
    (``can_replan``) any other death re-plans over the nodes that answer now: one that is gone is left
    out (more layers in RAM), one that came back is used again.

    With ``budget.limit`` restarts in the window already, or once given up (``tries``: the tries since
    giving up, None before), the move is :class:`GiveUp`, carrying the same move after the budget's long
    wait for that try."""
    budget = budget or RestartBudget()
    gave_up = tries is not None or restarts >= budget.limit
    delay = budget.retry_delay(tries or 0) if gave_up else backoff_s[min(restarts, len(backoff_s) - 1)]
    number = restarts + 1
    move: Restart | Replan
    if can_replan and not (failure is not None and failure.kind.is_memory):
        why = failure.kind.value if failure is not None else "the engine exited"
        move = Replan(why, delay, number)
    else:
        index = next((i for i, other in enumerate(options) if other is live), None)
        following = list(options[index + 1 :]) if index is not None else []
        option = following[0] if failure is not None and failure.kind.is_memory and following else live
        move = Restart(option, delay, number)
    if not gave_up:
        return move
    if tries is None:
        reason = f"{restarts} restarts within {budget.window_s:g} s (restart_limit {budget.limit})"
    else:
        reason = f"{tries} tr{'y' if tries == 1 else 'ies'} since giving up did not serve"
    return GiveUp(reason, move)
