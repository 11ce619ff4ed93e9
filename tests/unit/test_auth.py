"""One key check for serve and worker: either header may carry the key, a placeholder in the other."""

from __future__ import annotations

from gateway.core.auth import bearer_header, headers_carry_key


def test_either_header_carries_the_key_even_beside_a_placeholder() -> None:
    keys = ["k1", "k2"]
    assert headers_carry_key("Bearer k2", None, keys) and headers_carry_key(None, "k1", keys)
    assert headers_carry_key("Bearer placeholder", "k1", keys) and headers_carry_key("bearer k1", "placeholder", keys)
    assert not headers_carry_key("Bearer nope", "nope", keys) and not headers_carry_key("k1", None, keys)  # no scheme
    assert not headers_carry_key("Bearer ", "", keys) and not headers_carry_key("Bearer k1", None, [])


def test_the_header_sent_names_the_key_or_nothing() -> None:
    assert bearer_header("s3cret") == {"Authorization": "Bearer s3cret"} and bearer_header(None) == {}
