"""Sending slowly from a test client: what a slow or hostile client does to hold a connection open.

Why one helper: the tests that check the server's clocks each wrote the same sleep-and-send loop, with
its own handling of the server hanging up mid-way (a cut is what some of them wait for).
"""

from __future__ import annotations

import socket
import time


def trickle(conn: socket.socket, piece: bytes, *, times: int, every_s: float) -> int:
    """Send ``piece`` ``times`` times, ``every_s`` seconds apart (a pause before each); how many went
    before the server closed the connection (``times`` when it never did)."""
    for sent in range(times):
        time.sleep(every_s)
        try:
            conn.sendall(piece)
        except OSError:  # the server hung up: the caller asserts whether it should have
            return sent
    return times
