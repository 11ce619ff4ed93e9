"""Sending slowly from a test client: what a slow or hostile client does to hold a connection open.

Why one helper: the tests that check the server's clocks each wrote the same sleep-and-send loop, with
its own handling of the server hanging up mid-way (a cut is what some of them wait for).
"""

from __future__ import annotations

import select
import socket


def trickle(conn: socket.socket, piece: bytes, *, times: int, every_s: float) -> int:
    """Send ``piece`` ``times`` times, ``every_s`` seconds apart (a pause before each); how many went
    before the server answered or closed the connection (``times`` when it did neither). A pause ends
    early when the server speaks or hangs up: a cut is not waited out to the end of the schedule."""
    for sent in range(times):
        answered, _, _ = select.select([conn], [], [], every_s)
        if answered:  # an answer (the cut's status line) or the close: the caller reads which
            return sent
        try:
            conn.sendall(piece)
        except OSError:  # the server hung up: the caller asserts whether it should have
            return sent
    return times
