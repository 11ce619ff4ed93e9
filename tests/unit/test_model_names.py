"""Model names at the edge: which names are accepted and how responses are renamed."""

from __future__ import annotations

import json

from gateway.serving.dialects.model_names import ModelRoute


def test_accepts_fronted_name_aliases_and_served_name_in_any_case() -> None:
    route = ModelRoute(fronted="glm-4.7-flash", served="backend-glm", aliases=("glm",))
    assert route.accepts("GLM-4.7-Flash") and route.accepts("glm") and route.accepts("backend-glm")
    assert not route.accepts("gpt-4o")


def test_same_served_and_fronted_name_passes_bytes_untouched() -> None:
    route = ModelRoute(fronted="m", served="m")
    body = b'{"model": "m", "x": 1}'
    assert route.rewrite_body(body) is body
    assert route.stream_rewriter() is None


def test_response_body_names_the_fronted_model() -> None:
    route = ModelRoute(fronted="front", served="/models/back.gguf")
    out = json.loads(route.rewrite_body(b'{"model": "/models/back.gguf", "choices": []}'))
    assert out["model"] == "front"


def test_stream_rewriter_handles_a_name_split_across_network_reads() -> None:
    route = ModelRoute(fronted="front", served="back")
    rewriter = route.stream_rewriter()
    assert rewriter is not None
    stream = b'data: {"id":"1","model":"back","choices":[]}\n\ndata: {"model": "back"}\n\ndata: [DONE]\n\n'
    out = b"".join(rewriter.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + rewriter.flush()
    assert out == stream.replace(b'"back"', b'"front"')
