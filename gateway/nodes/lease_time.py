"""The time a worker's leases count: only the time the worker itself ran.

A lease is the head's word that it is still there, renewed every second; a worker that hears none for
``lease_s`` stops what it runs for that head. But a worker that did not run at all for a while heard
nothing because it was not listening, not because the head was gone, and the head's renewals of that
time are still waiting in its socket: the machine stalled (18-27 s on the test machine, a shell loop's
heartbeat stopped too, once seen as another vLLM engine stopped), the worker's process was stopped, the
VM was suspended. So the lease checks note how late each check woke, and that time is added to every
lease before any is judged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("gateway.worker")

LATE_S = 2.0  # a lease check this much later than asked: the worker itself did not run meanwhile


class AwakeClock:
    """Between two lease checks ``every_s`` apart, how long the worker was away (0: not noticeably)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = clock()

    def away(self, every_s: float) -> float:
        now = self.clock()
        late = now - self.last - every_s
        self.last = now
        if late <= LATE_S:
            return 0.0
        log.warning("this worker did not run for %.0f s (a stalled machine?): its leases run that much longer", late)
        return late
