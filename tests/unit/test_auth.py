"""One key check for serve and worker: either header may carry the key, a placeholder in the other; the
check names the configured key that matched, which is who the request is."""

from __future__ import annotations

from gateway.core.auth import bearer_header, matching_key


def test_either_header_carries_the_key_even_beside_a_placeholder() -> None:
    keys = ["k1", "k2"]
    assert matching_key("Bearer k2", None, keys) == "k2" and matching_key(None, "k1", keys) == "k1"
    assert (
        matching_key("Bearer placeholder", "k1", keys) == "k1"
        and matching_key("bearer k1", "placeholder", keys) == "k1"
    )
    assert matching_key("Bearer nope", "nope", keys) is None and matching_key("k1", None, keys) is None  # no scheme
    assert matching_key("Bearer ", "", keys) is None and matching_key("Bearer k1", None, []) is None


def test_the_key_matched_is_the_configured_one_whatever_else_is_sent() -> None:
    """A valid key beside a bogus value in the other header is that key, in either arrangement."""
    keys = ["k1", "k2"]
    for bogus in ("rotated-1", "rotated-2", "k1-but-longer", ""):
        assert matching_key(f"Bearer {bogus}", "k2", keys) == "k2"
        assert matching_key("Bearer k2", bogus, keys) == "k2"
    assert matching_key("Bearer k1", "k2", keys) == "k1"  # two valid keys: Bearer's, as before


def test_the_header_sent_names_the_key_or_nothing() -> None:
    assert bearer_header("s3cret") == {"Authorization": "Bearer s3cret"} and bearer_header(None) == {}
