"""What names a request's conversation for routing, and the conversations it descends from.

A turn is cheap only on the replica whose KV cache holds its conversation; a new conversation is cheap
where its parent's is, since an agent's subagents and threads start with the parent's system prompt and
tools. The agents say who the parent is (read from the CLIs that ``scripts/test`` installs, and in
``tests/data/agent-requests``):

- Claude Code: every request of one CLI process carries ``x-claude-code-session-id``; a subagent adds its
  own ``x-claude-code-agent-id`` and, when another subagent spawned it, ``x-claude-code-parent-agent-id``
  (the main thread sends neither). So a subagent's conversation is its agent id, its parents the parent
  agent and then the session (the main thread's conversation).
- Codex: ``session-id`` for the session, ``thread-id`` for each thread in it (the first thread's id is the
  session's); a subagent is another thread under the same session.
- opencode: ``x-session-affinity`` and ``x-session-id`` (the same id), and a child agent's session carries
  ``x-parent-session-id``: its parent's own id.

Anything else (Qwen Code, Cline, aider: no id) is named as the scheduler names its session
(:func:`gateway.serving.scheduling.sessions.identify`: ``prompt_cache_key``, else the conversation's
stable start), with no parent. Names are hashed and kept short: the binding table holds thousands.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

CLAUDE_SESSION = "x-claude-code-session-id"
CLAUDE_AGENT = "x-claude-code-agent-id"
CLAUDE_PARENT = "x-claude-code-parent-agent-id"
CODEX_SESSION = "session-id"
CODEX_THREAD = "thread-id"
OPENCODE_SESSION = ("x-session-affinity", "x-session-id")
OPENCODE_PARENT = "x-parent-session-id"
MAX_ID_CHARS = 256  # an id longer than this is cut (a client's header, not trusted to be short)


@dataclass(frozen=True)
class Affinity:
    """A request's conversation and, nearest first, the conversations it descends from (each a short hash)."""

    own: str
    parents: tuple[str, ...] = ()


def _name(kind: str, value: str) -> str:
    """A short, stable name for one id of one kind (a thread id never matches a session id by chance)."""
    text = f"{kind}\0{value.strip()[:MAX_ID_CHARS]}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _value(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    return value.strip() if value else ""


def affinity_of(headers: Mapping[str, str], session: str) -> Affinity:
    """The conversation a request continues and its parents, from the agent's headers; ``session`` (the
    scheduler's session id for the request) names it when the agent sends none of them."""
    names: list[str] = []

    def add(kind: str, value: str) -> None:
        if value:
            names.append(_name(kind, value))

    if claude := _value(headers, CLAUDE_SESSION):
        add("claude-agent", _value(headers, CLAUDE_AGENT))
        add("claude-agent", _value(headers, CLAUDE_PARENT))
        add("claude-session", claude)
    elif codex := _value(headers, CODEX_SESSION):
        add("codex-thread", _value(headers, CODEX_THREAD))
        add("codex-session", codex)
    elif opencode := next((v for v in (_value(headers, h) for h in OPENCODE_SESSION) if v), ""):
        add("session", opencode)
        add("session", _value(headers, OPENCODE_PARENT))
    if not names:
        add("scheduler", session or "-")
    unique = list(dict.fromkeys(names))
    return Affinity(unique[0], tuple(unique[1:]))
