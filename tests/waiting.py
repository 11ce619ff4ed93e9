"""Waiting in tests: poll a condition until it holds or a deadline passes.

Why one helper: a wait is where a test on a loaded 2-core machine flakes, and hand-written deadline
loops each chose their own step, message and way of failing (some spun on, some returned None). Here
every wait names what it awaited, may give up at once when the thing it waits on has died, and fails
with the same AssertionError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from gateway.core.tls import client_tls

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    *,
    what: str,
    timeout_s: float = 5.0,
    interval_s: float = 0.02,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """The condition's first truthy value; AssertionError naming ``what`` once ``timeout_s`` has passed,
    or as soon as ``abort`` returns a reason (say, the process that should answer exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if result := condition():
            return result
        if abort is not None and (reason := abort()):
            raise AssertionError(f"gave up waiting for {what}: {reason}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)  # between looks at the condition


def holds_within(condition: Callable[[], object], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Whether ``condition`` becomes true within ``timeout_s``: for tests whose assertion is the answer."""
    try:
        wait_until(condition, what="the condition", timeout_s=timeout_s, interval_s=interval_s)
    except AssertionError:
        return False
    return True


async def async_wait_until(
    condition: Callable[[], T], *, what: str, timeout_s: float = 5.0, interval_s: float = 0.02
) -> T:
    """``wait_until`` inside an event loop: sleeps without blocking it."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)  # between looks at the condition
    return result


def answers(url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200 now (a server still starting refuses the connection: False)."""
    try:
        return httpx.get(url, headers=headers, timeout=timeout_s, verify=client_tls()).status_code == 200
    except httpx.HTTPError:
        return False


def exited(process: object, log: Callable[[], str] | None = None) -> Callable[[], str | None]:
    """An ``abort`` for ``wait_until``: the reason, with the log's tail, once a ``Popen`` has exited."""

    def reason() -> str | None:
        code = process.poll()  # type: ignore[attr-defined]
        if code is None:
            return None
        return f"the process exited with {code}" + (f":\n{log()[-4000:]}" if log else "")

    return reason
