"""Several replicas behind the gateway's routes (issue 50): two stand-in engines on loopback ports, each
behind its own backend, client and admission, one router in front.

The engines are FakeEngine (tests/unit/http_harness.py): what this tests is the gateway's side, the
placement of each request, its retry on another replica before its first byte, a replica going down
or coming back (as its supervisor's state says), and the pool's one count per key. The real two
llama-server replicas are started in tests/integration/test_replicas_engine.py.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.routing.pool import Health
from gateway.serving.runtime import Engine, Runtime
from gateway.serving.scheduling.admission import Claim
from gateway.serving.transport.proxy import EngineClient, Timeouts
from gateway.supervision.lifecycle import ServedBackend, State
from gateway.supervision.replica_set import ReplicaSet, WithEnv, with_env
from tests.unit.http_harness import FRONTED, FakeBackend, FakeEngine, Served, make_runtime, sse_events
from tests.waiting import wait_until


@dataclass
class Two:
    """Two stand-in engines, the gateway's runtime over them, and each replica's backend."""

    engines: tuple[FakeEngine, FakeEngine]
    backends: tuple[FakeBackend, FakeBackend]
    runtime: Runtime

    def served_by(self, session: str) -> set[int]:
        """Which engines (0, 1) saw a chat request of ``session``."""
        return {
            number
            for number, engine in enumerate(self.engines)
            for seen in engine.seen
            if seen["path"] == "/v1/chat/completions"
            and str(seen["body"]["messages"][-1]["content"]).startswith(f"{session}:")
        }


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[tuple[FakeEngine, str], tuple[FakeEngine, str]]]:
    first, second = FakeEngine(), FakeEngine()
    servers = [Served(first.app, lifespan="off"), Served(second.app, lifespan="off")]
    yield (first, servers[0].url), (second, servers[1].url)
    for server in servers:
        server.stop()


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def two(engines: Any, *, urls: tuple[str, str] | None = None, per_key_limit: int = 0) -> Two:
    (first, first_url), (second, second_url) = engines
    for engine in (first, second):
        engine.reset()
    urls = urls or (first_url, second_url)
    backends = tuple(make_runtime(url).backend for url in urls)
    assert all(isinstance(b, FakeBackend) for b in backends)
    replicas = tuple(
        Engine(str(number), backend, EngineClient(Timeouts(connect_s=5, answer_s=30)))
        for number, backend in enumerate(backends, 1)
    )
    backend: ServedBackend = ReplicaSet(backends, ["1", "2"])
    one = make_runtime(urls[0], per_key_limit=per_key_limit)
    runtime = Runtime(
        route=one.route,
        backend=backend,
        engine_client=replicas[0].client,
        max_body_bytes=one.max_body_bytes,
        per_key_limit=per_key_limit,
        allowed_hosts=("testserver",),
        engines=replicas,
    )
    return Two((first, second), backends, runtime)  # type: ignore[arg-type]


def turn(http: TestClient, session: str, text: str = "hello", *, stream: bool = False) -> Any:
    body = {"model": FRONTED, "messages": [{"role": "user", "content": f"{session}: {text}"}], "stream": stream}
    return http.post("/v1/chat/completions", json=body, headers={"X-Claude-Code-Session-Id": session})


def test_each_session_stays_on_one_replica_and_both_serve(engines: Any) -> None:
    """Before: one engine took every request (the pool of replicas was not in the request path)."""
    pair = two(engines)
    with TestClient(create_app(pair.runtime)) as http:
        for number in range(3):
            for session in ("alpha", "beta"):
                assert turn(http, session, f"turn {number}").status_code == 200
    alpha, beta = pair.served_by("alpha"), pair.served_by("beta")
    assert len(alpha) == 1 and len(beta) == 1 and alpha != beta  # each on one, and both replicas served
    rows = {row["name"]: row for row in pair.runtime.pool.snapshot()["replicas"]}
    assert sum(row["warm"] for row in rows.values()) == 4  # every later turn went where its cache is
    assert all(row["active"] == 0 and row["queued"] == 0 for row in rows.values())  # every placement released
    assert all(upstream.admission.active == 0 for upstream in pair.runtime.upstreams)


def test_a_stream_is_placed_and_released_at_its_end(engines: Any) -> None:
    pair = two(engines)
    with TestClient(create_app(pair.runtime)) as http:
        first = turn(http, "alpha", stream=True)
        second = turn(http, "alpha", "again", stream=True)
    assert first.status_code == second.status_code == 200 and "[DONE]" in second.text
    assert len(pair.served_by("alpha")) == 1
    assert all(replica.load == 0 for replica in pair.runtime.pool.replicas)


def test_translated_answers_and_token_counts_release_their_placement(engines: Any) -> None:
    pair = two(engines)
    body = {"model": FRONTED, "max_tokens": 9, "messages": [{"role": "user", "content": "alpha: hi"}]}
    headers = {"X-Claude-Code-Session-Id": "alpha"}
    with TestClient(create_app(pair.runtime)) as http:
        whole = http.post("/v1/messages", json=body, headers=headers)
        streamed = http.post("/v1/messages", json={**body, "stream": True}, headers=headers)
        counted = http.post("/v1/messages/count_tokens", json=body, headers=headers)
    assert (whole.status_code, streamed.status_code, counted.status_code) == (200, 200, 200)
    assert whole.json()["type"] == "message" and "message_stop" in streamed.text and counted.json()["input_tokens"] > 0
    assert len(pair.served_by("alpha")) == 1
    assert all(replica.load == 0 for replica in pair.runtime.pool.replicas)
    assert all(upstream.admission.active == 0 for upstream in pair.runtime.upstreams)


def test_a_replica_that_refuses_before_the_first_byte_is_skipped_and_the_session_moves(engines: Any) -> None:
    """Replica 1 says it serves but its port is closed (it died a moment ago): the client gets its answer
    from replica 2, the session is bound there from now on, and replica 1 takes nothing new for a while."""
    dead = _closed_port()
    pair = two(engines, urls=(dead, engines[1][1]))
    with TestClient(create_app(pair.runtime)) as http:
        answers = [turn(http, session) for session in ("alpha", "beta", "alpha", "beta")]
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert [a.headers["x-gateway-replica"] for a in answers] == ["2"] * 4  # the one that answered
    assert pair.served_by("alpha") == pair.served_by("beta") == {1}
    first = pair.runtime.pool["1"]
    assert first.counters.failed == 1 and first.suspect_until > 0  # tried once, then avoided
    assert pair.runtime.pool["2"].counters.retry == 1
    assert all(replica.load == 0 for replica in pair.runtime.pool.replicas)


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_output_whose_prompt_is_counted_first_still_goes_to_the_replica_that_lives(
    engines: Any, stream: bool
) -> None:
    """Claude Code asks for 32,000 output tokens: the prompt is counted (to fit the output beside it) before the
    request is sent, on the replica it was placed on. Before: that count failed against the dead replica and
    the client got a 503 instead of the other replica's answer."""

    def first_dead() -> Two:
        pair = two(engines, urls=(_closed_port(), engines[1][1]))
        for backend in pair.backends:  # an engine that ignores include_usage: the stream's usage is counted too
            backend._launch = replace(backend._launch, native=frozenset())
        return pair

    body = {"model": FRONTED, "max_tokens": 32000, "stream": stream, "messages": [{"role": "user", "content": "alpha"}]}
    chat = {"model": FRONTED, "max_tokens": 32000, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    chat["stream_options"] = {"include_usage": True}
    with TestClient(create_app(first_dead().runtime)) as http:
        # each the first of its pool to reach replica 1 (after a failure it is avoided for a while)
        answers = [http.post("/v1/chat/completions", json=chat, headers={"X-Claude-Code-Session-Id": "c"})]
    with TestClient(create_app(first_dead().runtime)) as http:
        answers += [http.post("/v1/messages", json=body, headers={"X-Claude-Code-Session-Id": s}) for s in "ab"]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert [a.headers["x-gateway-replica"] for a in answers] == ["2", "2", "2"]


def test_a_replica_down_leaves_the_other_serving_and_its_sessions_move(engines: Any) -> None:
    pair = two(engines)
    with TestClient(create_app(pair.runtime)) as http:
        turn(http, "alpha")
        turn(http, "beta")
        (alpha_on,) = pair.served_by("alpha")
        pair.backends[alpha_on].state = State.RESTARTING  # its supervisor restarts it
        assert http.get("/ready").status_code == 200  # the other still serves
        assert turn(http, "alpha", "next").status_code == 200
        assert pair.served_by("alpha") == {0, 1}  # moved to the other
        moved = pair.runtime.pool[str(2 - alpha_on)].counters.moved_down
        assert moved == 1  # its next turn prefills again there, counted
        for backend in pair.backends:
            backend.state = State.FAILED
        assert http.get("/ready").status_code == 503
        refused = turn(http, "alpha", "nobody")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "backend_unavailable"


def test_a_restarted_replica_takes_new_sessions(engines: Any) -> None:
    """A replica that comes back (a new generation: an empty cache) keeps nothing bound; new sessions go to
    it, since it is the least loaded and holds the fewest conversations."""
    pair = two(engines)
    with TestClient(create_app(pair.runtime)) as http:
        turn(http, "alpha")
        (alpha_on,) = pair.served_by("alpha")
        back = pair.backends[alpha_on]
        back.state = State.STARTING
        turn(http, "alpha", "while it restarts")  # alpha moves to the other one
        back.restarts += 1
        back.state = State.READY
        assert turn(http, "gamma").status_code == 200
    assert pair.served_by("gamma") == {alpha_on}


def test_a_replica_that_failed_a_request_and_came_back_takes_new_sessions_at_once(engines: Any) -> None:
    """A request failed on it (it is avoided for a while: suspect), then its supervisor restarted it: the
    failure was its last life's. Before: it took nothing new for 10 s after coming back."""
    pair = two(engines)
    pool = pair.runtime.pool
    first = pool["1"]
    first.suspect_until = pool.clock() + 3600  # a request failed on it
    with TestClient(create_app(pair.runtime)) as http:
        turn(http, "alpha")
        assert pair.served_by("alpha") == {1}
        pair.backends[0].restarts += 1  # back, a new generation
        turn(http, "beta", " ".join(f"beta{i}" for i in range(100)))  # nothing of it held anywhere
    assert pair.served_by("beta") == {0}


def test_the_per_key_count_is_one_over_the_pool() -> None:
    runtime = two(((FakeEngine(), _closed_port()), (FakeEngine(), _closed_port())), per_key_limit=1).runtime
    first, second = (upstream.admission for upstream in runtime.upstreams)
    assert first is not second and first.by_key is second.by_key  # a key's requests counted once over both
    assert first.per_key_limit == second.per_key_limit == 1

    async def scenario() -> None:
        """A key at its cap on one replica waits on the other, and starts there when its slot frees."""
        held = await first.enter(Claim("team", "s1"))
        waiting = asyncio.ensure_future(second.enter(Claim("team", "s2")))
        other_key = await second.enter(Claim("other", "s3"))  # another key is not held back
        await asyncio.sleep(0.01)  # a few turns of the loop in which a wrongly admitted request would start
        assert not waiting.done() and second.queued == 1
        held.release()
        ticket = await asyncio.wait_for(waiting, 1)  # before: it waited for activity on its own replica
        ticket.release()
        other_key.release()
        assert not first.by_key and first.active == second.active == 0

    asyncio.run(scenario())


def test_the_replica_set_is_ready_while_one_replica_serves() -> None:
    backends = tuple(make_runtime("http://127.0.0.1:1").backend for _ in range(2))
    fakes: list[FakeBackend] = [b for b in backends if isinstance(b, FakeBackend)]
    replicas = ReplicaSet(fakes, ["1", "2"])
    assert replicas.ready and replicas.state is State.READY
    fakes[0].state = State.FAILED
    fakes[0].reason = "out of memory"
    assert replicas.ready and replicas.target is fakes[1].target
    assert replicas.reason == "replica 1: out of memory"
    fakes[1].state = State.RESTARTING
    assert not replicas.ready and replicas.state is State.RESTARTING
    snapshot = replicas.snapshot()
    assert [row["replica"] for row in snapshot["engines"]] == ["1", "2"] and snapshot["state"] == "restarting"
    assert "replica 1: out of memory" in replicas.report()
    with pytest.raises(ValueError, match="two or more"):
        ReplicaSet(fakes[:1], ["1"])


def test_the_replica_set_settles_when_the_first_replica_is_ready() -> None:
    class Slow(FakeBackend):
        def __init__(self, backend: FakeBackend, outcome: State, after_s: float) -> None:
            super().__init__(backend._launch, ready=False)
            self.outcome, self.after_s = outcome, after_s

        async def wait_settled(self) -> State:
            await asyncio.sleep(self.after_s)  # the stand-in's time to settle, the test's input
            self.state = self.outcome
            return self.outcome

    def backend() -> FakeBackend:
        made = make_runtime("http://127.0.0.1:1").backend
        assert isinstance(made, FakeBackend)
        return made

    failing, ready = Slow(backend(), State.FAILED, 0.01), Slow(backend(), State.READY, 0.05)
    assert asyncio.run(ReplicaSet([failing, ready], ["1", "2"]).wait_settled()) is State.READY
    both = [Slow(backend(), State.FAILED, 0.01), Slow(backend(), State.FAILED, 0.02)]
    assert asyncio.run(ReplicaSet(both, ["1", "2"]).wait_settled()) is State.FAILED


def test_a_replicas_option_launches_with_its_devices_through_every_step_down() -> None:
    class Option:
        engine, label, weights_key, context_length, estimated_tokens_per_s = "fake", "fake", (), 8192, 0.0

        def launch(self, port: int, api_key: str) -> Any:
            return make_runtime(f"http://127.0.0.1:{port}").backend.target

        def classify(self, line: str) -> None:
            return None

        def step_down(self, failure: Any) -> Any:
            return Option()

        def memo(self) -> dict[str, Any]:
            return {}

        def prepare(self) -> Any:
            return self

        def from_memo(self, memo: dict[str, Any]) -> Any:
            return self

    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    option = with_env(Option(), env)
    assert isinstance(option, WithEnv)
    assert option.launch(1234, "k").env == env
    lower = option.step_down(None)  # type: ignore[arg-type]
    assert lower is not None and lower.launch(1, "k").env == env and option.prepare().launch(1, "k").env == env
    plain = Option()
    assert with_env(plain, {}) is plain  # nothing to add: the option as it is


def test_health_follows_each_replicas_supervisor(engines: Any) -> None:
    pair = two(engines)
    first = pair.runtime.pool["1"]
    assert first.state is Health.UP
    pair.backends[0].state = State.FAILED
    assert first.state is Health.DOWN and pair.runtime.pool["2"].state is Health.UP


def test_a_started_stream_on_a_replica_cut_for_a_hang_ends_with_its_error_event_and_is_not_sent_again(
    engines: Any,
) -> None:
    """Its client already read the stream's start: the stream ends with the error event, nothing is retried,
    and the other replica's requests go on (each replica's own client is cut, not the pool's)."""
    pair = two(engines)
    why = "the engine stopped making progress (test); it is being restarted: retry"
    answers: dict[str, Any] = {}
    with TestClient(create_app(pair.runtime)) as http:
        turn(http, "alpha")
        (alpha_on,) = pair.served_by("alpha")
        hung = pair.runtime.pool[str(alpha_on + 1)].upstream.client
        thread = threading.Thread(target=lambda: answers.update(hang=turn(http, "alpha", "HANG", stream=True)))
        thread.start()
        # the first turn's answer, then the hanging stream's first chunk
        wait_until(lambda: hung.activity().chunks >= 2, what="the hanging stream's first chunk")
        assert http.portal is not None
        http.portal.call(hung.cut, why)
        thread.join(5)
        other = turn(http, "beta")
    stream = answers["hang"]
    assert stream.status_code == 200 and stream.headers["x-gateway-replica"] == str(alpha_on + 1)
    _, last = sse_events(stream.text)[-1]
    assert last["error"]["message"] == why
    hangs = [e for e in pair.engines if any("HANG" in str(s["body"].get("messages")) for s in e.seen)]
    assert hangs == [pair.engines[alpha_on]]  # sent once, to its own replica
    assert other.status_code == 200 and why not in other.text
    assert all(replica.load == 0 for replica in pair.runtime.pool.replicas)


def test_a_data_parallel_group_is_one_engine_whose_ranks_keep_their_sessions(engines: Any) -> None:
    """A vLLM data-parallel group (gateway.cli.startup._group): one engine, one backend, and each rank a replica
    whose client names it (vLLM's X-data-parallel-rank), so every turn of a session reaches the rank that holds
    its prefix; without the header vLLM's front end would pick the shortest queue each time."""
    from gateway.backends import vllm

    (engine, url), _ = engines
    engine.reset()
    backend = make_runtime(url).backend
    ranks = tuple(
        Engine(f"rank-{rank}", backend, EngineClient(Timeouts(connect_s=5, answer_s=30), headers=headers))
        for rank, headers in enumerate(vllm.BACKEND.rank_headers(rank) for rank in range(2))
    )
    one = make_runtime(url)
    runtime = Runtime(
        route=one.route,
        backend=backend,
        engine_client=ranks[0].client,
        max_body_bytes=one.max_body_bytes,
        allowed_hosts=("testserver",),
        engines=ranks,
    )
    with TestClient(create_app(runtime)) as http:
        for number in range(3):
            for session in ("alpha", "beta"):
                assert turn(http, session, f"turn {number}").status_code == 200
    chats = engine.requests_to("/v1/chat/completions")
    rank_of: dict[str, set[str]] = {}
    for seen in chats:
        session = str(seen["body"]["messages"][-1]["content"]).split(":")[0]
        rank_of.setdefault(session, set()).add(seen["headers"]["x-data-parallel-rank"])
    assert len(chats) == 6 and all(len(seen) == 1 for seen in rank_of.values())  # each session on one rank
    assert rank_of["alpha"] != rank_of["beta"]  # and both ranks serve
