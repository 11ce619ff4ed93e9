"""Many agent sessions at once on one engine: does a warm turn stay warm and quick when others arrive?

    PYTHONPATH=. .venv/bin/python benchmarks/agent_load.py [--target gateway|direct] [--engine llamacpp|vllm]
        [--sessions 1,4,8,16] [--turns 4] [--fairness [--burst-turns K]] [--api-keys k1,k2] [--json FILE]
        [--logs DIR]

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
process running subagents sends). Qwen Code, Cline and aider send no session id.

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

The model: ``--model tiny`` (tests/integration/tools/session_models.py), SmolLM2's tokenizer and tool
template on a tiny random body: real prompt sizes and cache hits, prefill fast enough for 20k-token
prompts on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
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
from benchmarks.rpc_vs_local import free_port, process, wait_ok
from gateway.serving.dialects import messages_api, responses_api
from gateway.serving.dialects.prompt_prefix import strip_billing_header
from tests.integration.tools import session_models

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


def _recorded(agent: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        (RECORDED / FOLDERS.get(agent, agent) / f"{SESSIONS[agent][0]}.json").read_text()
    )
    return record


def _fresh_id(recorded: str) -> str:
    """A new id shaped like the recorded one (opencode's ``ses_…``, else a uuid)."""
    return "ses_" + uuid.uuid4().hex[:26] if recorded.startswith("ses_") else str(uuid.uuid4())


def conversation(label: str, turns: int, ids: dict[str, str] | None = None) -> Conversation:
    """The agent's recorded conversation made a new one: a marker on its first user text, and its
    session ids (headers and body: Codex's ``prompt_cache_key``, Claude Code's ``metadata``) replaced
    by fresh ones, or by ``ids`` (recorded → new) to keep another conversation's."""
    agent = label.split("#")[0]
    record = _recorded(agent)
    headers = {name: value for name, value in record["headers"].items() if name not in DROPPED_HEADERS}
    bodies = session(agent, turns)
    for body in bodies:
        _retitle(body, agent, label)
    recorded = {headers[name] for name in SESSION_HEADERS if name in headers}
    ids = ids if ids is not None else {old: _fresh_id(old) for old in recorded}
    text = json.dumps([headers, bodies])
    for old, new in ids.items():
        text = text.replace(old, new)
    headers, bodies = json.loads(text)
    return Conversation(label, agent, SESSIONS[agent][2], headers, bodies)


def conversations(count: int, turns: int, *, keys: int = 0, share_subagents: bool = False) -> list[Conversation]:
    """The first ``count`` of MIX (past 16 it repeats), numbered per agent, each with its key in turn."""
    picked = [MIX[i % len(MIX)] for i in range(count)]
    labels = [f"{agent}#{picked[:i].count(agent) + 1}" for i, agent in enumerate(picked)]
    out: list[Conversation] = []
    for i, label in enumerate(labels):
        main = next((c for c in out if c.agent == "claude"), None) if share_subagents else None
        ids = _ids_of(main) if main is not None and label.startswith("claude#") else None
        made = conversation(label, turns, ids)
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


def send(
    client: httpx.Client, target: Target, conv: Conversation, body: dict[str, Any], max_tokens: int, retries: int
) -> dict[str, Any]:
    """One turn, streamed: prompt/cached (the engine's count), output tokens, TTFT from the first try,
    and the 429s it waited out. Raises on anything else than 200 or 429 with Retry-After."""
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
            for event in _events(response):
                if first is None and _generated(event):
                    first = time.perf_counter() - started
                usage = _usage(event) or usage
                found = _output(event)
                output = found if found is not None else output
        if usage is None:
            raise RuntimeError(f"{route}: no usage in the stream")
        total = time.perf_counter() - started
        return {
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
                rows.append(row | {"error": f"{type(exc).__name__}: {exc}"[:400]})
                continue
            row["new"] = row["prompt"] - previous
            previous = row["prompt"]
            row["goal_met"] = goal_met(row)
            rows.append(row)
    return rows


def concurrently(jobs: Sequence[tuple[Conversation, range]], target: Target, **kw: Any) -> list[dict[str, Any]]:
    """Each conversation's turns on its own thread, all started together; the rows in finishing order."""
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(jobs))

    def one(conv: Conversation, turns: range) -> None:
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


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between the two nearest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """One run's figures: later turns within the prefill goal, TTFT of warm (later) and cold (first)
    turns apart, output tokens/s over the run's wall time, errors and 429s waited out."""
    done = [row for row in rows if "error" not in row]
    later = [row for row in done if row["turn"] > 1]
    warm = [row["ttft_ms"] for row in later]
    cold = [row["ttft_ms"] for row in done if row["turn"] == 1]
    return {
        "requests": len(rows),
        "later_turns": len([row for row in rows if row["turn"] > 1]),
        "later_within_goal": sum(row["goal_met"] for row in later),
        "later_new": sum(row["new"] for row in later),
        "later_prefilled": sum(row["prefilled"] for row in later),
        "warm_ttft_p50_ms": percentile(warm, 50),
        "warm_ttft_p95_ms": percentile(warm, 95),
        "cold_ttft_p50_ms": percentile(cold, 50),
        "cold_ttft_p95_ms": percentile(cold, 95),
        "output_tokens": sum(row["output"] for row in done),
        "output_tokens_per_s": round(sum(row["output"] for row in done) / wall_s, 2) if wall_s > 0 else None,
        "errors": len(rows) - len(done),
        "limited_429": sum(row["limited"] for row in done),
        "wall_s": round(wall_s, 1),
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value / 1000:,.1f} s" if value >= 10_000 else f"{value:,.0f} ms"


def table(runs: list[dict[str, Any]]) -> str:
    """The runs as a markdown table, one row each."""
    lines = [
        "| target | engine | sessions × turns | later turns within goal | later turns: new / prefilled "
        "| TTFT warm p50 / p95 | TTFT cold p50 / p95 | output tok/s | errors | 429s | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        lines.append(
            f"| {run['target']} | {run['engine']} | {run['sessions']} × {run['turns']} "
            f"| {s['later_within_goal']}/{s['later_turns']} | {s['later_new']:,} / {s['later_prefilled']:,} "
            f"| {_ms(s['warm_ttft_p50_ms'])} / {_ms(s['warm_ttft_p95_ms'])} "
            f"| {_ms(s['cold_ttft_p50_ms'])} / {_ms(s['cold_ttft_p95_ms'])} "
            f"| {s['output_tokens_per_s']} | {s['errors']} | {s['limited_429']} | {s['wall_s']:.0f} s |"
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


# -- engines -------------------------------------------------------------------------------------------


def _model_path(args: argparse.Namespace, cache: Path) -> tuple[list[str], str]:
    """The gateway's --model arguments and the name requests use."""
    if args.engine == "vllm":
        checkpoint = session_models.tiny_checkpoint(cache, VLLM_PYTHON)
        vllm = f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server"
        return ["--model", str(checkpoint), "--vllm-command", vllm], checkpoint.name
    gguf = session_models.tiny_gguf(cache) if args.model == "tiny" else session_models.smollm2_32k(cache)
    launch = ["--model", str(gguf), "--llama-launcher", "native", "--llama-draft", "off"]
    return [*launch, "--threads", str(args.threads)], gguf.stem


@contextlib.contextmanager
def gateway(args: argparse.Namespace, workdir: Path, keys: list[str]) -> Iterator[Target]:
    """``gateway serve`` on the plan's own flags, as agent_sessions.py starts it; stopped at the end."""
    cache = Path(os.environ.get("GATEWAY_TEST_CACHE", Path.home() / ".cache" / "gateway-tests"))
    model_args, model = _model_path(args, cache)
    port = free_port()
    state = workdir / f"state-{port}"
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", str(CONTEXT),
        "--state-dir", str(state), "--replan", "--engine", args.engine, *model_args,
    ]  # fmt: skip
    argv += [part for key in keys for part in ("--api-key", key)] + shlex.split(args.serve_args)
    log = workdir / f"gateway-{port}.log"
    with process(argv, log) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/ready", proc, log, timeout_s=900)
        auth = {"authorization": f"Bearer {keys[0]}"} if keys else {}
        status = httpx.get(url + "/status", headers=auth, timeout=10).json()["backend"]
        yield Target(url, status.get("served_name") or model, status["argv"], keys=keys)


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
    parser.add_argument("--max-retries", type=int, default=10, help="429s with Retry-After waited out per turn")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's --threads")
    parser.add_argument("--serve-args", default="", help="more `gateway serve` flags (e.g. '--sessions 8')")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one request may take")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, help="keep the gateway's and engines' logs in this folder")
    args = parser.parse_args()
    if args.engine == "vllm" and args.model != "tiny":
        parser.error("--engine vllm runs --model tiny")
    counts = [int(n) for n in args.sessions.split(",") if n]
    keys = [key for key in args.api_keys.split(",") if key]
    if args.target == "direct" and keys:
        parser.error("--api-keys is the gateway's; the engine alone takes none")
    if args.engine == "vllm":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
        def fresh() -> Iterator[Target]:
            """A freshly started target, so each run starts with an empty cache."""
            nonlocal engine
            if args.target == "gateway":
                with gateway(args, workdir, keys) as target:
                    yield target
                return
            if engine is None:
                with gateway(args, workdir, []) as probe:
                    engine = (probe.argv, probe.model)
            with direct(args, workdir, *engine) as target:
                yield target

        for count in counts:
            with fresh() as target:
                results["argv"] = target.argv
                convs = conversations(count, args.turns, keys=len(keys), share_subagents=args.subagents_share_session)
                print(f"{count} sessions × {args.turns} turns: {', '.join(c.label for c in convs)}", flush=True)
                origin = time.perf_counter()
                rows = concurrently([(c, range(args.turns)) for c in convs], target, origin=origin, **kw)
                wall = time.perf_counter() - origin
                run = {"target": args.target, "engine": args.engine, "sessions": count, "turns": args.turns}
                run |= {"summary": summarize(rows, wall), "rows": rows}
                results["runs"].append(run)
                print(table([run]), flush=True)
                for row in rows:
                    if "error" in row or not row.get("goal_met", True):
                        print("  ", {k: row.get(k) for k in ("session", "turn", "new", "prefilled", "error")})
        if args.fairness:
            with fresh() as target:
                results["argv"] = target.argv
                print(f"fairness: {args.fairness_session} alone, then under {args.burst} cold first turns")
                fair = {"target": args.target, "engine": args.engine, **fairness(target, args)}
                results["fairness"] = fair
        results["load_after"] = os.getloadavg()
        results["wall_s"] = round(time.monotonic() - started, 1)
    print(args.engine, " ".join(results.get("argv", [])[1:]))
    if results["runs"]:
        print(table(results["runs"]))
    if "fairness" in results:
        print(fairness_table(results["fairness"]))
    load = f"load average before {results['load_before']}, after {results['load_after']}"
    print(f"{results['wall_s']:.0f} s in all; {load}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    failed = sum(run["summary"]["errors"] for run in results["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
