"""`gateway agent NAME`: the exact configuration each coding agent needs for a running gateway.

Every agent must be told the model's name and the context length the gateway serves (none reads
``context_length`` from ``/v1/models`` by itself); this asks the gateway and prints the configuration
in the agent's own format, so pointing an agent at the gateway is one command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gateway.errors import ConfigError

COMPACT_AT = 0.85  # share of the window at which agents that can be told should compact
KEY_VARIABLE = "GATEWAY_API_KEY"


@dataclass(frozen=True)
class Served:
    """What a running gateway serves, as its /v1/models says."""

    url: str  # without /v1
    model: str
    context_length: int

    @property
    def max_output(self) -> int:
        """A quarter of the window for the answer, the rest for the prompt."""
        return max(256, self.context_length // 4)


@dataclass(frozen=True)
class AgentConfig:
    where: str  # the file it goes in, or how to use it
    text: str
    format: str  # toml | json | shell


def ask(url: str, api_key: str | None) -> Served:
    """The model and context the gateway at ``url`` serves."""
    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = httpx.get(base + "/v1/models", headers=headers, timeout=10, trust_env=False)
    except httpx.HTTPError as exc:
        raise ConfigError(f"no gateway answers at {base} ({type(exc).__name__}): start it or pass --url") from exc
    if answer.status_code == 401:
        raise ConfigError(f"{base} wants an API key: pass --api-key")
    cards = (answer.json().get("data") or []) if answer.status_code == 200 else []
    if not cards:
        raise ConfigError(f"{base}/v1/models lists no model (HTTP {answer.status_code}): is it a gateway?")
    card = cards[0]
    return Served(base, str(card["id"]), int(card.get("context_length") or card.get("max_model_len") or 0))


def codex(s: Served) -> AgentConfig:
    text = f"""model = {json.dumps(s.model)}
model_provider = "gateway"
model_context_window = {s.context_length}
model_auto_compact_token_limit = {int(s.context_length * COMPACT_AT)}

[model_providers.gateway]
name = "gateway"
base_url = {json.dumps(s.url + "/v1")}
wire_api = "responses"
env_key = "{KEY_VARIABLE}"  # export {KEY_VARIABLE}=<a key of the gateway's, or anything when it has none>
"""
    return AgentConfig("~/.codex/config.toml", text, "toml")


def claude(s: Served) -> AgentConfig:
    model = shlex.quote(s.model)
    lines = [
        f"export ANTHROPIC_BASE_URL={shlex.quote(s.url)}",
        f'export ANTHROPIC_AUTH_TOKEN="${{{KEY_VARIABLE}:-anything}}"',
        f"export ANTHROPIC_MODEL={model}",
        # every tier it may pick, or it sends claude-* names the gateway does not serve
        f"export ANTHROPIC_DEFAULT_OPUS_MODEL={model} ANTHROPIC_DEFAULT_SONNET_MODEL={model}",
        f"export ANTHROPIC_DEFAULT_HAIKU_MODEL={model}",
        f"export CLAUDE_CODE_AUTO_COMPACT_WINDOW={s.context_length}",  # it assumes 200k otherwise
        f"export CLAUDE_CODE_MAX_OUTPUT_TOKENS={s.max_output}",
    ]
    return AgentConfig("your shell, before `claude`", "\n".join(lines) + "\n", "shell")


def opencode(s: Served) -> AgentConfig:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "gateway": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": s.url + "/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"},
                "models": {s.model: {"limit": {"context": s.context_length, "output": s.max_output}}},
            }
        },
        "model": f"gateway/{s.model}",
    }
    return AgentConfig(
        "opencode.json (or ~/.config/opencode/opencode.json)", json.dumps(config, indent=2) + "\n", "json"
    )


def aider(s: Served) -> AgentConfig:
    metadata = {f"openai/{s.model}": {"max_input_tokens": s.context_length, "max_output_tokens": s.max_output}}
    lines = [
        f"echo {shlex.quote(json.dumps(metadata))} > .aider.model.metadata.json",
        f'aider --openai-api-base {shlex.quote(s.url + "/v1")} --openai-api-key "${{{KEY_VARIABLE}:-anything}}" '
        f"--model {shlex.quote('openai/' + s.model)}",
    ]
    return AgentConfig("your shell, in the project", "\n".join(lines) + "\n", "shell")


AGENTS: dict[str, Callable[[Served], AgentConfig]] = {
    "codex": codex,
    "claude": claude,
    "opencode": opencode,
    "aider": aider,
}
