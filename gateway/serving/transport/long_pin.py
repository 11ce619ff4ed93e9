"""Placing a long prefill in the engine as it is sent (:class:`gateway.backends.base.LongPin`), and the gate
that holds the gateway's other requests to that engine back meanwhile.

The engine's page says where the long request may go once nothing else can take that place first: the
place free, and each of the gateway's other requests already in the engine (one on its way could be
placed there before it). From the read that places it until the engine holds it (the page shows it there:
:func:`open_when_taken`; or a prefill run ahead sends its first event: gateway.serving.transport.prefill_first),
every other request to the engine waits at the gate: on the CPU that is one step of the engine at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.backends.base import LongPin, Primer
from gateway.serving.transport.proxy import EngineClient
from gateway.serving.wire.error_shapes import ApiError
from gateway.supervision.lifecycle import EngineTarget

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the page is read again while the place is not free
TAKEN_S = 5.0  # the gate opens after this long even if the page never shows the request held
PRIME_S = 5.0  # a primer (a few tokens) answered later than this is given up: the prefill goes unpinned


async def place_long(
    client: EngineClient,
    target: EngineTarget,
    pin: LongPin,
    others: Callable[[], int],
    *,
    held: int = 0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Mapping[str, Any]:
    """The fields a long prefill carries to ``target``, read from its page while ``client``'s gate is closed,
    which stays closed where there are any (the caller opens it once the engine holds the request); {}
    where the page gives none within ``pin.wait_s`` (or gives none at all). ``others``: the gateway's other
    requests holding the engine's slots; ``held``: the tokens of its prompt the engine likely holds."""
    deadline = clock() + pin.wait_s
    while True:
        fields = await place_once(client, target, pin.path, lambda page: pin.place(page, others(), held), pin.primer)
        if fields is None and clock() < deadline:
            await sleep(POLL_S)
            continue
        return fields or {}


async def place_once(
    client: EngineClient,
    target: EngineTarget,
    path: str,
    place: Callable[[str], Mapping[str, Any] | None],
    primer: Primer | None = None,
) -> Mapping[str, Any] | None:
    """``place``'s fields from one read of the engine's ``path`` page, the gate closed from the read on and
    kept closed where there are any (the caller opens it once the engine holds the request); {}: none (no
    page either), None: not yet; the gate is open again for both. Fields that ask for ``primer`` have it
    run in the engine first, the gate still closed; {} where it fails (the request then goes unpinned)."""
    gate = client.gate
    await gate.passed()
    gate.close()
    try:
        page = await client.page(target, path)
        fields = place(page) if page is not None else {}
        if fields and primer is not None and fields.get(primer.marker):
            fields = await _primed(client, target, primer, fields)
    except BaseException:
        gate.open()
        raise
    if not fields:
        gate.open()
    return fields


async def _primed(
    client: EngineClient, target: EngineTarget, primer: Primer, fields: Mapping[str, Any]
) -> Mapping[str, Any]:
    """``fields`` without the primer's marker once the primer has run; {} where it did not."""
    fields = {name: value for name, value in fields.items() if name != primer.marker}
    try:
        async with asyncio.timeout(PRIME_S):  # the gate is closed meanwhile: a hung engine holds it this long at most
            status, _answer = await client.post_json(target, primer.path, dict(primer.body(fields)))
    except ApiError as exc:
        status = exc.status
    except TimeoutError:
        status = 504
    if status != 200:
        log.info("priming the engine's place for a long prefill failed (%s); it goes unpinned", status)
        return {}
    return fields


async def open_when_taken(
    client: EngineClient,
    target: EngineTarget,
    pin: LongPin,
    fields: Mapping[str, Any],
    *,
    within_s: float = TAKEN_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Open ``client``'s gate once the engine's page shows the placed request held (or ``within_s`` later,
    or when cancelled: the request failed before it reached the engine)."""
    deadline = clock() + within_s
    try:
        while clock() < deadline:
            page = await client.page(target, pin.path)
            if page is not None and pin.taken(page, fields):
                return
            await sleep(POLL_S / 5)
    finally:
        client.gate.open()
