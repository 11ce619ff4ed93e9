"""The load benchmark's pure parts (benchmarks/agent_load.py): what it counts and how it builds sessions,
so the figures it reports for issue 39 mean what its table says."""

from __future__ import annotations

import json
from typing import Any

import httpx

from benchmarks.agent_load import (
    SESSION_HEADERS,
    Target,
    _retry_after,
    conversations,
    engine_argv,
    engine_request,
    fairness_figures,
    percentile,
    summarize,
    with_notes,
)


def _row(turn: int, ttft: int, *, new: int = 100, prefilled: int = 100, goal: bool = True) -> dict[str, Any]:
    return {"turn": turn, "ttft_ms": ttft, "new": new, "prefilled": prefilled, "goal_met": goal, "output": 8}


def test_percentile_is_linear_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7], 95) == 7
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 0, 20], 95) == 19.0


def test_summary_separates_warm_from_cold_and_errors_from_429s() -> None:
    rows = [
        _row(1, 5000) | {"limited": 0},
        _row(2, 100) | {"limited": 2},
        _row(3, 300, new=50, prefilled=900, goal=False) | {"limited": 0},
        {"turn": 4, "error": "RuntimeError: 500"},
        {"turn": 1, "error": "ReadTimeout"},
    ]
    s = summarize(rows, wall_s=4.0)
    assert (s["requests"], s["errors"], s["limited_429"]) == (5, 2, 2)
    assert (s["later_turns"], s["later_within_goal"]) == (3, 1)  # the failed later turn counts as missed
    assert (s["later_new"], s["later_prefilled"]) == (150, 1000)
    assert (s["warm_ttft_p50_ms"], s["cold_ttft_p50_ms"]) == (200, 5000)
    assert s["output_tokens_per_s"] == 6.0


def test_fairness_ratio_is_against_the_median_warm_turn_alone() -> None:
    alone = [_row(1, 9000), _row(2, 800), _row(3, 1000), _row(4, 900)]
    figures = fairness_figures(alone, _row(5, 45_000))
    assert (figures["alone_median_ms"], figures["ratio"]) == (900, 50.0)


def test_conversations_are_new_with_fresh_session_ids_and_subagents_share_claude_system() -> None:
    convs = conversations(8, 3, keys=2)
    assert [c.label for c in convs][-2:] == ["claude#2", "codex#2"]
    assert [c.key for c in convs[:3]] == [0, 1, 0]
    ids = [{c.headers[name] for name in SESSION_HEADERS if name in c.headers} for c in convs]
    assert [len(one) for one in ids] == [1, 1, 0, 1, 0, 0, 1, 1]  # opencode sends its id twice
    assert len(set.union(*ids)) == 5
    codex = convs[1]
    assert all(body["prompt_cache_key"] == codex.headers["session-id"] for body in codex.turns)
    first, sub = convs[0], convs[6]
    assert first.turns[0]["system"][1:] == sub.turns[0]["system"][1:]  # all but the billing line
    assert first.turns[0]["tools"] == sub.turns[0]["tools"]
    assert first.turns[0]["messages"] != sub.turns[0]["messages"]  # a different first task
    assert sub.headers["x-claude-code-session-id"] in sub.turns[0]["metadata"]["user_id"]
    shared = conversations(8, 1, share_subagents=True)
    assert shared[0].headers["x-claude-code-session-id"] == shared[6].headers["x-claude-code-session-id"]


def test_burst_turns_differ_after_the_system_prompt_only_in_their_notes() -> None:
    (claude,) = conversations(1, 1)
    a, b = with_notes(claude, "repo-1"), with_notes(claude, "repo-2")
    assert a.turns[0]["system"][:-1] == b.turns[0]["system"][:-1] == claude.turns[0]["system"]
    assert a.turns[0]["system"][-1] != b.turns[0]["system"][-1]


def test_direct_requests_are_what_the_gateway_sends_the_engine() -> None:
    convs = conversations(2, 1)
    llama = Target("http://x", "m", [], direct=True, translate=True)
    route, chat = engine_request(llama, "/v1/messages", {**convs[0].turns[0], "stream": True})
    assert route == "/v1/chat/completions" and chat["messages"][0]["role"] == "system"
    assert "x-anthropic-billing-header" not in json.dumps(chat)
    route, chat = engine_request(llama, "/v1/responses", {**convs[1].turns[0], "stream": True})
    assert route == "/v1/chat/completions" and "tools" in chat
    vllm = Target("http://x", "m", [], direct=True)
    assert engine_request(vllm, "/v1/responses", convs[1].turns[0])[0] == "/v1/responses"


def test_engine_argv_moves_the_port_and_drops_the_redacted_key() -> None:
    argv = ["llama-server", "--host", "127.0.0.1", "--port", "9", "--api-key", "***", "-np", "4"]
    assert engine_argv(argv, 1234) == ["llama-server", "--host", "127.0.0.1", "--port", "1234", "-np", "4"]


def test_retry_after_is_read_as_the_sdks_read_it() -> None:
    assert _retry_after(httpx.Response(429, headers={"retry-after-ms": "1500", "retry-after": "2"})) == 1.5
    assert _retry_after(httpx.Response(429, headers={"retry-after": "2"})) == 2.0
    assert _retry_after(httpx.Response(429)) is None  # a 429 without it is an error, not waited out
