"""`gateway agent NAME` prints each agent's configuration for the gateway it asks, and each parses the
way the agent reads it (TOML, JSON, shell). The Codex one also drives the real Codex CLI in
tests/integration/test_agent_apis_scripted.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cli import main
from tests.unit.http_harness import Served


def _gateway(key: str | None = None) -> Starlette:
    async def models(request: Request) -> Response:
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "no"}}, status_code=401)
        return JSONResponse({"data": [{"id": "glm-4.7-flash", "context_length": 32768}]})

    return Starlette(routes=[Route("/v1/models", models)])


@pytest.fixture
def gateway() -> Iterator[str]:
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
    names = ["ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
             "CLAUDE_CODE_AUTO_COMPACT_WINDOW", "CLAUDE_CODE_MAX_OUTPUT_TOKENS", "ANTHROPIC_AUTH_TOKEN"]  # fmt: skip
    env = _shell(_printed(capsys, "claude", "--url", gateway), names, tmp_path)
    assert env["ANTHROPIC_BASE_URL"] == gateway  # the Messages API lives at the root, not under /v1
    assert {env[n] for n in names[1:4]} == {"glm-4.7-flash"}
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "32768" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "anything"


def test_opencode(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads(_printed(capsys, "opencode", "--url", gateway))
    provider = config["provider"]["gateway"]
    assert provider["options"]["baseURL"] == gateway + "/v1"
    assert provider["models"]["glm-4.7-flash"]["limit"] == {"context": 32768, "output": 8192}
    assert config["model"] == "gateway/glm-4.7-flash"


def test_aider(gateway: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    first, command = _printed(capsys, "aider", "--url", gateway).splitlines()
    subprocess.run(["bash", "-c", first], check=True, cwd=tmp_path)
    metadata = json.loads((tmp_path / ".aider.model.metadata.json").read_text())
    assert metadata["openai/glm-4.7-flash"]["max_input_tokens"] == 32768
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
