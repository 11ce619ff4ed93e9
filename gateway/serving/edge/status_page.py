"""The /status page for people: the same data as the JSON, rendered on the server (no scripts)."""

from __future__ import annotations

import html
import json
from typing import Any

from gateway.serving.routing.ttft import RECENT


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _node_rows(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per device (a node without devices: one row with its state and why)."""
    rows: list[dict[str, Any]] = []
    for node in nodes:
        label = f"{node.get('name')} {node.get('address') or ''}".strip()
        state = node.get("state") if not node.get("error") else f"{node.get('state')}: {node['error']}"
        devices = node.get("devices") or []
        if node.get("placed_mib"):  # this machine: the engine's own device names
            rows.append({"node": label, "state": state, "device": "(engine's names)", **_placed(node)})
        for device in devices:
            where = (
                f"{device.get('name')} {device.get('endpoint') or ''} ({device.get('total_bytes', 0) / 2**30:.2f} GiB)"
            )
            rows.append({"node": label, "state": state, "device": where, "link": device.get("link"), **_placed(device)})
        if not devices and not node.get("placed_mib"):
            rows.append({"node": label, "state": state})
    return rows


def _placed(item: dict[str, Any]) -> dict[str, Any]:
    return {"placed_mib": item.get("placed_mib")}


def _speed_row(speed: dict[str, Any]) -> dict[str, Any]:
    """Measured (the engine's own timings) beside the plan's estimate, tokens per second."""
    measured = speed.get("measured") or {}
    row = {
        "decode": f"measured {measured.get('decode_tokens_per_s', '–')}",
        "prompt": f"measured {measured.get('prompt_tokens_per_s', '–')}",
        "estimated decode": speed.get("estimated") or "–",
    }
    if "draft_acceptance" in measured:  # speculative decoding: the share of drafted tokens kept
        row["drafts accepted"] = f"{measured['draft_acceptance']:.0%} of {measured.get('drafted_tokens', '?')}"
    return row


REPLICA_COLUMNS = [
    "replica",
    "node",
    "devices",
    "state",
    "sessions_bound",
    "queued",
    "active",
    "requests",
    "warm_share",
    "ttft_s_mean",
    "ttft_s_p95",
    "moved_load",
    "moved_down",
    "retry",
    "failed",
]


def _replicas(pool: dict[str, Any]) -> list[str]:
    """More than one engine serves the model: each replica, where it runs, how it is used, and the pool's totals."""
    rows = [
        {
            **row,
            "replica": row.get("name"),
            "node": row.get("node") or "this machine",
            "devices": ", ".join(str(device) for device in row.get("devices") or []),
        }
        for row in pool.get("replicas") or []
    ]
    rows.append({**(pool.get("totals") or {}), "replica": "all"})
    balance = pool.get("balance") or {}
    line = (
        f"A conversation stays on its replica unless that one's load exceeds the least loaded one's by more "
        f"than {balance.get('abs_threshold')} requests and {balance.get('rel_threshold')} times; warm_share: of "
        f"the later turns, the share sent where their cache was; TTFT p95 over each replica's latest {RECENT} "
        "first outputs."
    )
    return ["<h2 id='replicas'>Replicas</h2>", _table(rows, REPLICA_COLUMNS), f"<p>{html.escape(line)}</p>"]


USAGE_COLUMNS = [
    "requests",
    "errors",
    "prompt_evaluated",
    "prompt_reused",
    "reused_share",
    "output_tokens",
    "queue_wait_s_mean",
    "ttft_s_mean",
]


def _usage(usage: dict[str, Any], scheduling: dict[str, Any]) -> list[str]:
    """Who uses the node: per API key, the top sessions, and how requests are scheduled now."""
    parts = ["<h2 id='usage'>Who uses the node</h2>"]
    if scheduling:
        line = (
            f"{scheduling.get('active', 0)} of {scheduling.get('capacity', 0)} engine slots busy, "
            f"{scheduling.get('queued', 0)} waiting; long prefills {scheduling.get('long_prefills_active', 0)} "
            f"of {scheduling.get('long_lane') or 'any'}; per-key cap {scheduling.get('per_key_limit') or 'none'}"
        )
        parts.append(f"<p id='scheduling'>{html.escape(line)}</p>")
        if scheduling.get("engine"):
            parts.append(f"<p>{html.escape(str(scheduling['engine']))}</p>")
    if usage.get("keys"):
        parts.append("<h3>Per API key</h3>" + _table(usage["keys"], ["key", *USAGE_COLUMNS]))
    if usage.get("sessions"):
        columns = ["key", "session", "agent", "named_by", *USAGE_COLUMNS]
        parts.append("<h3>Sessions (top by tokens)</h3>" + _table(usage["sessions"], columns))
    if len(parts) == 1:
        parts.append("<p>no inference requests yet</p>")
    return parts


def render(status: dict[str, Any]) -> str:
    plan = status.get("plan") or {}
    backend = status.get("backend") or {}
    attempts = status.get("attempts") or []
    candidates = plan.get("candidates") or []
    gpus = status.get("gpus") or []
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gateway status</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}pre{background:#f6f6f6;"
        "padding:1em;overflow:auto}.state{font-weight:bold}</style></head><body>",
        f"<h1>{html.escape(str(status.get('model')))}</h1>",
        f"<p>state: <span class='state' id='state'>{html.escape(str(status.get('state')))}</span>"
        f" · context {html.escape(str(status.get('context_length')))} tokens"
        f" · restarts {html.escape(str(status.get('restarts', 0)))}</p>",
        f"<h2>Decision</h2><p id='decision'>{html.escape(str(plan.get('decision', '')))}</p>",
    ]
    if plan.get("engine_version"):
        parts.append(f"<p>{html.escape(str(plan['engine_version']))}</p>")
    if candidates:
        rows = [
            {
                "backend": c.get("backend"),
                "fits": c.get("fits"),
                "rung": c.get("rung") or c.get("launcher"),
                "context": c.get("context_length"),
                "memory": c.get("memory_gib") or c.get("memory_mib"),
                "reason": c.get("reason"),
            }
            for c in candidates[:40]
        ]
        parts.append("<h2>Candidates</h2>" + _table(rows, ["backend", "fits", "rung", "context", "memory", "reason"]))
    if attempts:
        parts.append(
            "<h2>Attempts</h2>"
            + _table(attempts, ["number", "engine", "label", "outcome", "elapsed_s", "failure", "action"])
        )
    if backend:
        parts.append(
            "<h2>Live backend</h2>" + _table([backend], ["engine", "state", "pid", "url", "uptime_s", "summary"])
        )
        if speed := status.get("speed"):
            row = _speed_row(speed)
            parts.append("<h3>Speed</h3>" + _table([row], list(row)))
        if backend.get("argv"):
            parts.append("<pre>" + html.escape(" ".join(backend["argv"])) + "</pre>")
        if backend.get("last_lines"):
            parts.append("<h3>Last log lines</h3><pre>" + html.escape("\n".join(backend["last_lines"])) + "</pre>")
    if gpus:
        columns = ["gpu", "name", "planned_gib", "used_gib", "total_gib"]
        parts.append("<h2>GPUs the plan uses</h2>" + _table(gpus, columns))
    if nodes := status.get("nodes"):
        parts.append("<h2>Nodes</h2>" + _table(_node_rows(nodes), ["node", "state", "device", "link", "placed_mib"]))
    if replans := status.get("replans"):
        parts.append("<h3>Re-plans</h3>" + _table(replans, ["at", "why", "decision", "error"]))
    if pool := status.get("pool"):
        parts += _replicas(pool)
    parts += _usage(status.get("usage") or {}, status.get("scheduling") or {})
    parts.append("<p><a href='/status?format=json'>JSON</a> · <a href='/metrics'>metrics</a></p></body></html>")
    return "".join(parts)
