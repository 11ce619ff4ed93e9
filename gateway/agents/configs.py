"""Each coding agent's configuration for a running gateway, in the agent's own format.

Every agent must be told the model's name and the context length the gateway serves (none reads
``context_length`` from ``/v1/models`` by itself). Each generator returns the text `gateway agent NAME`
prints and the files `--write` merges it into; the comment above each one names the agent's
documentation or source it was checked against.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from gateway.core.auth import bearer_header
from gateway.core.errors import ConfigError
from gateway.core.tls import http_get

COMPACT_AT = 0.85  # share of the window at which agents that can be told should compact
KEY_VARIABLE = "GATEWAY_API_KEY"

Doc = dict[str, Any]


@dataclass(frozen=True)
class Served:
    """What a running gateway serves, as its /v1/models says."""

    url: str  # without /v1
    model: str
    context_length: int
    api_key: str | None = None  # what --api-key gave; written only where the agent keeps keys in its file

    @property
    def max_output(self) -> int:
        """An eighth of the window for each answer, the rest for the conversation: agents compact once it
        reaches the window less this reservation, and a small model that rambles stops here instead of
        filling the window (Claude Code resumes up to three times after the limit, so long answers still
        come through)."""
        return max(256, self.context_length // 8)

    @property
    def key_or_placeholder(self) -> str:
        """The key for agents that need a literal one: any value passes a gateway without keys."""
        return self.api_key or "anything"

    def export_key(self) -> str:
        """How to give agents that read the key from GATEWAY_API_KEY one."""
        return f"export {KEY_VARIABLE}={'<your key>' if self.api_key else 'anything'}"


class WrongType(ValueError):
    """A key the configuration goes into holds another type in the agent's file (``"providers": 5``):
    the agent could not read it either, and replacing it would lose what the user wrote."""

    def __init__(self, key: str, expected: type, found: Any) -> None:
        names = {dict: "a table (JSON object)", list: "a list", str: "a string", bool: "true/false"}
        found_name = names.get(type(found), "a number" if isinstance(found, int | float) else type(found).__name__)
        super().__init__(f"'{key}' holds {found_name} where {names.get(expected, expected.__name__)} belongs")


def table(doc: Doc, key: str, where: str = "") -> Doc:
    """``doc[key]`` as a table (a copy; absent or null: empty), or WrongType naming ``where`` + key."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WrongType(where + key, dict, value)
    return dict(value)


def entries(doc: Doc, key: str, where: str = "") -> list[Any]:
    """``doc[key]`` as a list (absent or null: empty), or WrongType naming ``where`` + key."""
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise WrongType(where + key, list, value)
    return list(value)


def deep_merge(base: Doc, ours: Doc, where: str = "") -> Doc:
    """``base`` with ``ours`` laid over it: tables merge key by key, anything else is replaced; a table
    of ours where ``base`` has something else (not null) is WrongType."""
    merged = dict(base)
    for key, value in ours.items():
        if isinstance(value, dict):
            merged[key] = deep_merge(table(merged, key, where), value, f"{where}{key}.")
        else:
            merged[key] = value
    return merged


LIST_KEY = "entries"  # where a yaml-list file's entries are while it is merged (the file holds only the list)


@dataclass(frozen=True)
class Target:
    """A file the agent reads, and how our part goes into what is already there."""

    path: Path
    format: str  # toml | json | yaml | yaml-list (a YAML list at the top, as {LIST_KEY: [...]})
    merge: Callable[[Doc], Doc]


@dataclass(frozen=True)
class AgentConfig:
    where: str  # the file it goes in, or how to use it
    text: str
    format: str  # toml | json | shell
    targets: tuple[Target, ...] = ()  # what --write merges; empty: environment variables only
    notes: tuple[str, ...] = field(default=())  # what the user still does by hand (a key to export, a UI)


def ask(url: str, api_key: str | None) -> Served:
    """The model and context the gateway at ``url`` serves."""
    base = url.rstrip("/").removesuffix("/v1")
    headers = bearer_header(api_key)
    try:
        answer = http_get(base + "/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise ConfigError(f"no gateway answers at {base} ({type(exc).__name__}): start it or pass --url") from exc
    if answer.status_code == 401:
        raise ConfigError(f"{base} wants an API key: pass --api-key")
    cards = (answer.json().get("data") or []) if answer.status_code == 200 else []
    if not cards:
        raise ConfigError(f"{base}/v1/models lists no model (HTTP {answer.status_code}): is it a gateway?")
    card = cards[0]
    context = int(card.get("context_length") or card.get("max_model_len") or 0)
    return Served(base, str(card["id"]), context, api_key)


def _home_dir(variable: str, default: str) -> Path:
    """An agent's own directory: its override variable when set, else under the home directory."""
    explicit = os.environ.get(variable, "").strip()
    return Path(explicit).expanduser() if explicit else Path.home() / default


# Codex: ~/.codex/config.toml ($CODEX_HOME overrides ~/.codex); keys model, model_provider,
# model_context_window, model_auto_compact_token_limit and [model_providers.<id>] base_url / wire_api /
# env_key as in openai/codex docs/config.md ("Config reference"); the real Codex CLI runs from this in
# tests/integration/test_agent_apis_scripted.py.
def codex(s: Served) -> AgentConfig:
    ours: Doc = {
        "model": s.model,
        "model_provider": "gateway",
        "model_context_window": s.context_length,
        "model_auto_compact_token_limit": int(s.context_length * COMPACT_AT),
        "model_providers": {
            "gateway": {"name": "gateway", "base_url": s.url + "/v1", "wire_api": "responses", "env_key": KEY_VARIABLE}
        },
    }
    text = tomli_w.dumps(ours)
    path = _home_dir("CODEX_HOME", ".codex") / "config.toml"
    return AgentConfig(
        "~/.codex/config.toml", text, "toml", (Target(path, "toml", lambda old: deep_merge(old, ours)),),
        (f"{s.export_key()} before `codex`",),
    )  # fmt: skip


# Claude Code, as 2.1.328 and 2.1.197 read it (both binaries, `strings bin/claude.exe`): a model id outside its
# compiled catalog is "unknown" and gets CLAUDE_CODE_MAX_CONTEXT_TOKENS as its window (1M when unset in
# 2.1.328, 200k in 2.1.197). It compacts once the prompt reaches the window less its reservation for the
# answer (the output limit, at most 20,000), less 13,000 more, or CLAUDE_AUTOCOMPACT_PCT_OVERRIDE percent of
# that room when that is lower. CLAUDE_CODE_AUTO_COMPACT_WINDOW (and the settings' autoCompactWindow) can
# only lower the window, and below 100,000 it is read as 100,000 (2.1.328 says so on every run). Below
# roughly 100k the fixed 13,000 would put the compaction point below the prompt Claude Code starts with
# (at 8,192 it would compact before every request), so the window written is what makes it compact at
# COMPACT_AT of the real room; its read-size room, which follows the compaction point, is then right too,
# and past it the engine's overflow (the gateway's "prompt is too long") makes it compact as well.
CLAUDE_COMPACT_MARGIN = 13_000  # tokens below the room it compacts at, whatever the window
CLAUDE_MAX_RESERVED = 20_000  # its reservation for the answer is the output limit, at most this
CLAUDE_MIN_COMPACT_WINDOW = 100_000  # CLAUDE_CODE_AUTO_COMPACT_WINDOW's floor
CLAUDE_CODE_VERSIONS = "2.1.328 (and 2.1.197)"  # the releases these settings were read from and tested with


def claude_window(s: Served) -> int:
    """CLAUDE_CODE_MAX_CONTEXT_TOKENS: the served window, or more where only more puts Claude Code's
    compaction point (the room less 13,000) at COMPACT_AT of the real room."""
    reserved = min(s.max_output, CLAUDE_MAX_RESERVED)
    compact_at = int(COMPACT_AT * (s.context_length - reserved))
    return max(s.context_length, reserved + CLAUDE_COMPACT_MARGIN + compact_at)


def _claude_env(s: Served, token: str) -> dict[str, str]:
    window = claude_window(s)
    env = {
        "ANTHROPIC_BASE_URL": s.url,  # the Messages API lives at the root, not under /v1
        "ANTHROPIC_AUTH_TOKEN": token,
        "ANTHROPIC_MODEL": s.model,
        # every tier it may pick (a subagent may ask for any of the four by name), or it sends claude-* names
        # the gateway does not serve
        "ANTHROPIC_DEFAULT_FABLE_MODEL": s.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": s.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": s.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": s.model,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(window),  # see claude_window
        "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(round(COMPACT_AT * 100)),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(s.max_output),
        # no x-anthropic-billing-header line at the top of the system prompt: it changes between
        # conversations and side requests (and per request in 2.1.36-2.1.177), so the engine's prefix
        # cache would end at the first line (the gateway also strips it: gateway/serving/dialects/prompt_prefix.py)
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }
    if window >= CLAUDE_MIN_COMPACT_WINDOW:
        # the same window again, which 2.1.328 reads the same way; 2.1.197 compacts before the engine
        # refuses only with it (without it, it waits for the "prompt is too long" and compacts then)
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(window)
    return env


# Claude Code: environment variables (code.claude.com/docs/en/env-vars and model-config, "Correct the window
# for a gateway or custom model ID"; read from the binaries of CLAUDE_CODE_VERSIONS, above); --write puts
# them in the `env` block of ~/.claude/settings.json ($CLAUDE_CONFIG_DIR overrides ~/.claude), which
# code.claude.com/docs/en/settings describes as "environment variables that will be applied to every
# session" (literal strings, no $VAR). Model discovery (CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY) stays
# off: it only adds to the /model picker the ids of the gateway's /v1/models that name claude or anthropic,
# and sets no window.
def claude(s: Served) -> AgentConfig:
    env = _claude_env(s, "")
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items() if name != "ANTHROPIC_AUTH_TOKEN"]
    lines.insert(1, f'export ANTHROPIC_AUTH_TOKEN="${{{KEY_VARIABLE}:-anything}}"')
    window = env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]
    if int(window) > s.context_length:
        at = lines.index(f"export CLAUDE_CODE_MAX_CONTEXT_TOKENS={window}")
        lines[at] += (
            f"  # the model has {s.context_length}: Claude Code compacts 13,000 short of this, "
            f"at {round(COMPACT_AT * 100)}% of the model's room"
        )
    ours: Doc = {"env": _claude_env(s, s.key_or_placeholder)}
    path = _home_dir("CLAUDE_CONFIG_DIR", ".claude") / "settings.json"
    return AgentConfig(
        "your shell, before `claude` (or --write: the env block of ~/.claude/settings.json)",
        "\n".join(lines) + "\n", "shell", (Target(path, "json", lambda old: deep_merge(old, ours)),),
        (f"`claude --version`: these are the settings Claude Code {CLAUDE_CODE_VERSIONS} read",),
    )  # fmt: skip


# opencode: custom provider with "npm": "@ai-sdk/openai-compatible", options.baseURL / apiKey ("{env:VAR}"
# substitution) and models.<id>.limit.context / output, as in opencode.ai/docs/providers ("Custom provider")
# and opencode.ai/docs/config; the global file is ~/.config/opencode/opencode.json ($XDG_CONFIG_HOME honoured),
# merged with a project's opencode.json key by key.
def opencode(s: Served) -> AgentConfig:
    ours: Doc = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "gateway": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "gateway",
                "options": {"baseURL": s.url + "/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"},
                "models": {s.model: {"limit": {"context": s.context_length, "output": s.max_output}}},
            }
        },
        "model": f"gateway/{s.model}",
    }
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    path = (Path(xdg) if xdg else Path.home() / ".config") / "opencode" / "opencode.json"
    return AgentConfig(
        "opencode.json (or ~/.config/opencode/opencode.json)", json.dumps(ours, indent=2) + "\n", "json",
        (Target(path, "json", lambda old: deep_merge(old, ours)),),
        (f"{s.export_key()} before `opencode` when the gateway has keys",),
    )  # fmt: skip


# Qwen Code: ~/.qwen/settings.json, checked against QwenLM/qwen-code docs/users/configuration/settings.md and
# model-providers.md ("Local Self-Hosted Models"): an OpenAI-compatible endpoint is a `modelProviders.openai[]`
# entry (id = the model name sent, envKey required, baseUrl, generationConfig.contextWindowSize and
# samplingParams.max_tokens); `security.auth.selectedType` = "openai" and `model.name` = that id select it.
# A selected provider entry is "impermeable": model.generationConfig.contextWindowSize is then not read,
# so the window goes in the entry. (The env route OPENAI_BASE_URL/OPENAI_API_KEY/OPENAI_MODEL builds a
# "runtime model" that only model.generationConfig.contextWindowSize can size.) Its managed auto-memory puts
# about 1,400 tokens in every system prompt (settings.md: memory.enableManagedAutoMemory, default true); with
# Qwen Code 0.24.4's own ~7,500 that is more than an 8k window holds (seen: 8,787 tokens on the default
# model, refused), so below QWEN_MEMORY_MIN_CONTEXT it is turned off.
QWEN_MEMORY_MIN_CONTEXT = 16384


def qwen(s: Served) -> AgentConfig:
    entry: Doc = {
        "id": s.model,
        "name": f"{s.model} (gateway)",
        "envKey": KEY_VARIABLE,
        "baseUrl": s.url + "/v1",
        "generationConfig": {"contextWindowSize": s.context_length, "samplingParams": {"max_tokens": s.max_output}},
    }
    ours: Doc = {
        "modelProviders": {"openai": [entry]},
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": s.model},
    }
    if s.context_length < QWEN_MEMORY_MIN_CONTEXT:
        ours["memory"] = {"enableManagedAutoMemory": False}
    scalars = {key: value for key, value in ours.items() if key != "modelProviders"}

    def merge(old: Doc) -> Doc:
        """Ours replaces an entry with the same id (Qwen Code keeps only the first); the user's others stay."""
        merged = deep_merge(old, scalars)
        providers = table(merged, "modelProviders")
        kept: list[Any] = []
        for old_entry in entries(providers, "openai", "modelProviders."):
            same = isinstance(old_entry, dict) and old_entry.get("id") == s.model
            if not same:
                kept.append(old_entry)
            elif entry not in kept:
                kept.append(entry)
        providers["openai"] = kept if entry in kept else [*kept, entry]
        merged["modelProviders"] = providers
        return merged

    path = Path.home() / ".qwen" / "settings.json"
    notes = [f"{s.export_key()} before `qwen` (Qwen Code reads the key only from the envKey variable)"]
    if "memory" in ours:
        notes.append(f"auto-memory is off: its prompt does not fit beside Qwen Code's in {s.context_length} tokens")
    return AgentConfig(
        "~/.qwen/settings.json", json.dumps(ours, indent=2) + "\n", "json", (Target(path, "json", merge),),
        tuple(notes),
    )  # fmt: skip


CLINE_PROVIDER = "openai-compatible"


def _now() -> str:
    """Cline's updatedAt: an ISO datetime in UTC with a Z, which its zod schema requires."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Cline (CLI, and the VS Code extension built on the same @cline/core): provider settings live in
# ~/.cline/data/settings/providers.json ($CLINE_PROVIDER_SETTINGS_PATH, $CLINE_DATA_DIR, $CLINE_DIR override),
# checked against cline/cline sdk/packages/core/src/types/provider-settings.ts (StoredProviderSettings:
# version 1, lastUsedProvider, modes, providers.<id> = {settings, updatedAt, tokenSource}),
# sdk/packages/core/src/services/llms/provider-settings.ts (settings.provider/apiKey/model/baseUrl/
# contextWindow/maxTokens; contextWindow becomes maxInputTokens, which compaction reads) and
# sdk/packages/shared/src/storage/paths.ts. Its apps/cli/DEVELOPMENT.md prefers `cline auth` to editing the
# file, but `cline auth -p openai-compatible -k KEY -m MODEL -b URL` cannot set the context window, so the
# notes also give that command and the settings-panel steps (docs/provider-config/openai-compatible.mdx).
def cline(s: Served) -> AgentConfig:
    settings: Doc = {
        "provider": CLINE_PROVIDER,
        "apiKey": s.key_or_placeholder,
        "model": s.model,
        "baseUrl": s.url + "/v1",
        "contextWindow": s.context_length,
        "maxTokens": s.max_output,
    }
    ours: Doc = {
        "version": 1,
        "lastUsedProvider": CLINE_PROVIDER,
        "providers": {CLINE_PROVIDER: {"settings": settings, "updatedAt": _now(), "tokenSource": "manual"}},
    }

    def merge(old: Doc) -> Doc:
        """Our settings over the entry's; updatedAt moves only when they change, so a rerun is a no-op."""
        merged = {"version": 1, "modes": {}, **old, "lastUsedProvider": CLINE_PROVIDER}
        providers = table(merged, "providers")
        entry = table(providers, CLINE_PROVIDER, "providers.")
        where = f"providers.{CLINE_PROVIDER}."
        new_settings = deep_merge(table(entry, "settings", where), settings, where + "settings.")
        if new_settings != entry.get("settings") or "updatedAt" not in entry:
            entry.update(settings=new_settings, updatedAt=_now(), tokenSource="manual")
        providers[CLINE_PROVIDER] = entry
        merged["providers"] = providers
        return merged

    explicit = os.environ.get("CLINE_PROVIDER_SETTINGS_PATH", "").strip()
    data = os.environ.get("CLINE_DATA_DIR", "").strip()
    data_dir = Path(data) if data else _home_dir("CLINE_DIR", ".cline") / "data"
    path = Path(explicit) if explicit else data_dir / "settings" / "providers.json"
    ui = (
        f'VS Code: Cline settings (gear icon) > API Provider "OpenAI Compatible" > Base URL {s.url}/v1, '
        f"API Key {'<your key>' if s.api_key else 'anything'}, Model ID {s.model}; under Model Configuration "
        f"set Context Window Size {s.context_length} and Max Output Tokens {s.max_output}"
    )
    quick = shlex.join(["cline", "auth", "-p", CLINE_PROVIDER, "-k", s.key_or_placeholder if not s.api_key
                        else "<your key>", "-m", s.model, "-b", s.url + "/v1"])  # fmt: skip
    return AgentConfig(
        "~/.cline/data/settings/providers.json", json.dumps(ours, indent=2) + "\n", "json",
        (Target(path, "json", merge),),
        (ui, f"or the CLI, without the context window: {quick}"),
    )  # fmt: skip


# aider: `--openai-api-base/--openai-api-key --model openai/<name>` (aider.chat/docs/llms/openai-compat.html);
# the window goes in .aider.model.metadata.json, read from the home directory, the git root and the current
# directory (aider.chat/docs/config/adv-model-settings.html: max_input_tokens, max_output_tokens,
# litellm_provider matching the openai/ prefix); --write also sets model, openai-api-base and openai-api-key
# in ~/.aider.conf.yml, read from the same three places (aider.chat/docs/config/aider_conf.html). aider sends
# no output limit of its own (max_output_tokens above is only for its token report): the limit goes in as
# `extra_params: {max_tokens: N}` of the model's entry in ~/.aider.model.settings.yml (a YAML list of
# entries by name, read from the same places; adv-model-settings.html), so a rambling model stops.
def aider(s: Served) -> AgentConfig:
    metadata: Doc = {
        f"openai/{s.model}": {
            "max_tokens": s.max_output,
            "max_input_tokens": s.context_length,
            "max_output_tokens": s.max_output,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }
    conf: Doc = {"model": f"openai/{s.model}", "openai-api-base": s.url + "/v1", "openai-api-key": s.key_or_placeholder}
    settings: Doc = {"name": f"openai/{s.model}", "extra_params": {"max_tokens": s.max_output}}

    def merge_settings(old: Doc) -> Doc:
        """Our entry over the user's entry for the same model (its other keys stay); other models' stay."""
        listed = old.get(LIST_KEY) or []
        mine = next((e for e in listed if isinstance(e, dict) and e.get("name") == settings["name"]), None)
        if mine is None:
            return {LIST_KEY: [*listed, settings]}
        return {LIST_KEY: [deep_merge(e, settings, f"{settings['name']}.") if e is mine else e for e in listed]}

    lines = [
        f"echo {shlex.quote(json.dumps(metadata))} > .aider.model.metadata.json",
        f"echo {shlex.quote(json.dumps([settings]))} > .aider.model.settings.yml",  # JSON is YAML too
        f'aider --openai-api-base {shlex.quote(s.url + "/v1")} --openai-api-key "${{{KEY_VARIABLE}:-anything}}" '
        f"--model {shlex.quote('openai/' + s.model)}",
    ]
    home = Path.home()
    return AgentConfig(
        "your shell, in the project (or --write: ~/.aider.model.metadata.json, ~/.aider.model.settings.yml and "
        "~/.aider.conf.yml)",
        "\n".join(lines) + "\n", "shell",
        (Target(home / ".aider.model.metadata.json", "json", lambda old: deep_merge(old, metadata)),
         Target(home / ".aider.model.settings.yml", "yaml-list", merge_settings),
         Target(home / ".aider.conf.yml", "yaml", lambda old: deep_merge(old, conf))),
    )  # fmt: skip


AGENTS: dict[str, Callable[[Served], AgentConfig]] = {
    "codex": codex,
    "claude": claude,
    "opencode": opencode,
    "qwen": qwen,
    "cline": cline,
    "aider": aider,
}
