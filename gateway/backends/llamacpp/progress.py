"""What llama-server has done so far, read from its ``GET /slots`` for the gateway's progress watch.

Read from llama.cpp's source (tools/server/server-context.cpp, b11434): ``/slots`` is on by default
(``--no-slots`` turns it off) and is answered by the server's main loop itself, as a high-priority task
between two batches, so an answer proves the loop turns. Each slot reports ``id_task`` (its current or
last request), ``n_prompt_tokens_processed`` (raised per prompt token put in a batch: a long prefill
moves it batch by batch) and ``next_token[0].n_decoded`` (tokens generated). Both restart at 0 with a
new request, so the mark is every slot's triple rather than a sum: any change is progress. Because the
main loop writes the answer, its ``is_processing`` is current: no slot processing means the requests
in flight wait on something else (a client reading slowly), not on the engine. Each processing slot is
also a part of its own (``Progress.parts``): b11434 can leave one slot re-processing a prompt it never
finishes (a request pinned with ``id_slot`` to a busy slot loads another prompt into it:
get_available_slot, server-context.cpp:1686-1790) while the other slots serve on, so the whole mark moves.
"""

from __future__ import annotations

import json

from gateway.backends.base import Progress

SLOTS_PATH = "/slots"


def slots_progress(text: str) -> Progress | None:
    """The slots' (id, task, prompt tokens processed, tokens generated, processing), or None for an
    answer that is not the slots list (an error object, text)."""
    try:
        slots = json.loads(text)
    except ValueError:
        return None
    if not isinstance(slots, list):
        return None
    mark = []
    for slot in slots:
        if not isinstance(slot, dict):
            return None
        tokens = slot.get("next_token")
        first = tokens[0] if isinstance(tokens, list) and tokens and isinstance(tokens[0], dict) else {}
        mark.append(
            (
                _number(slot.get("id")),
                _number(slot.get("id_task")),
                _number(slot.get("n_prompt_tokens_processed")),
                _number(first.get("n_decoded")),
                bool(slot.get("is_processing")),
            )
        )
    parts = tuple((f"slot {slot}", (task, done, decoded)) for slot, task, done, decoded, busy in mark if busy)
    return Progress(tuple(mark), busy=any(processing for *_, processing in mark), parts=parts)


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
