"""One key check for serve and worker: either header may carry the key, a placeholder in the other."""

from __future__ import annotations

from gateway.core.auth import bearer_header, key_accepted


def test_either_header_carries_the_key_even_beside_a_placeholder() -> None:
    keys = ["k1", "k2"]
    assert key_accepted("Bearer k2", None, keys) and key_accepted(None, "k1", keys)
    assert key_accepted("Bearer placeholder", "k1", keys) and key_accepted("bearer k1", "placeholder", keys)
    assert not key_accepted("Bearer nope", "nope", keys) and not key_accepted("k1", None, keys)  # no scheme
    assert not key_accepted("Bearer ", "", keys) and not key_accepted("Bearer k1", None, [])


def test_the_header_sent_names_the_key_or_nothing() -> None:
    assert bearer_header("s3cret") == {"Authorization": "Bearer s3cret"} and bearer_header(None) == {}
