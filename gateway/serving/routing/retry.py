"""A request whose replica fails before the client got a byte is sent to another replica.

Until the gateway answers (a non-streamed answer whole, a stream's headers), the client has seen
nothing, so a replica that refuses the connection, drops it, or is cut because it hung costs the
client only the time lost: the request is placed again on a replica it has not been tried on (the
conversation moves there: its cache goes with it from now on) and the failed replica takes no new
placement for a while. Once a byte went out, a failure is the client's to read (a stream ends with its
error event) and nothing is retried. Neither is what the replica answered itself (an HTTP error, a
timeout while it prefilled: sending the prompt again elsewhere would double the work), nor the
gateway's own refusals (a full queue).

The wrapper knows nothing of HTTP: ``call`` sends the request to ``attempt.replica`` and returns what
the client will get, and says :meth:`Attempt.first_byte` if it sent the client anything before it
could still fail.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import aiohttp

from gateway.serving.routing.pool import Placement, Pool, Replica
from gateway.serving.wire.error_shapes import ApiError

log = logging.getLogger("gateway.routing")

U = TypeVar("U")
T = TypeVar("T")


class Attempt(Generic[U]):
    """One try of a request on one replica."""

    def __init__(self, placement: Placement[U], number: int) -> None:
        self.placement = placement
        self.number = number  # 1 for the first try
        self.sent = False

    @property
    def replica(self) -> Replica[U]:
        return self.placement.replica

    def first_byte(self) -> None:
        """The client got something of this try: from now on its failure is the client's to read."""
        self.sent = True


def replica_failed(exc: BaseException) -> bool:
    """The replica itself failed before answering: the transport's 503 (refused, reset, cut because it
    hung, not ready), or a connection error raised as it is."""
    if isinstance(exc, ApiError):
        return exc.status == 503 and exc.code == "backend_unavailable"
    return isinstance(exc, aiohttp.ClientConnectionError | ConnectionError)


async def retry_before_first_byte(
    pool: Pool[U],
    placement: Placement[U],
    call: Callable[[Attempt[U]], Awaitable[T]],
    *,
    retryable: Callable[[BaseException], bool] = replica_failed,
) -> T:
    """``call`` on the request's replica, then, while it fails with nothing sent and ``retryable``, on each
    other replica that serves, once. What ``call`` returns is the client's, and the placement it ran on
    (``attempt.placement``) is then the caller's to release; a try that raised is released here. When no
    replica is left, the last failure is raised."""
    number = 1
    while True:
        attempt = Attempt(placement, number)
        try:
            return await call(attempt)
        except BaseException as exc:
            placement.release()
            if attempt.sent or not retryable(exc):
                raise
            pool.failed(placement)
            again = pool.reroute(placement)
            if again is None:
                raise
            log.warning(
                "replica %s failed before answering (%s); the request goes to replica %s",
                placement.replica.name,
                exc,
                again.replica.name,
            )
            placement, number = again, number + 1
