"""An empty key is no key: `--api-key ""` (the README's `--api-key "$GATEWAY_API_KEY"` with the variable
unset), a blank entry in GATEWAY_API_KEYS and a key file without a key are refused before `serve` starts
anything, as `worker` refuses them; and the browser guard follows the keys actually in force."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.cli.commands import main
from gateway.cli.full_settings import Settings, load_settings
from gateway.core.errors import ConfigError
from gateway.serving.app import create_app
from tests.unit.http_harness import make_runtime


@pytest.mark.parametrize("keys", [[""], ["  "], ["good", ""], ["\t"]], ids=["empty", "spaces", "one-of-two", "tab"])
def test_a_blank_key_is_refused_with_the_fix(tmp_path: Path, keys: list[str]) -> None:
    with pytest.raises(ConfigError, match=r'empty --api-key .*"\$GATEWAY_API_KEY"'):
        Settings(api_keys=keys, state_dir=tmp_path).read_api_keys()


def test_a_blank_key_from_the_environment_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", '[""]')
    with pytest.raises(ConfigError, match="GATEWAY_API_KEYS"):
        load_settings({"state_dir": tmp_path}).read_api_keys()


def test_keys_lose_the_spaces_a_header_would_lose(tmp_path: Path) -> None:
    assert Settings(api_keys=[" k1 ", "k2"], state_dir=tmp_path).read_api_keys() == ("k1", "k2")


def test_a_key_file_without_a_key_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("\n   \n# the key goes here\n")
    with pytest.raises(ConfigError, match="holds no key"):
        Settings(api_key_file=empty, state_dir=tmp_path).read_api_keys()
    empty.write_text("# ours\n  sk-1  \n")
    assert Settings(api_key_file=empty, state_dir=tmp_path).read_api_keys() == ("sk-1",)


def test_a_key_file_that_is_a_fifo_or_a_device_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    with pytest.raises(ConfigError, match="a FIFO, not a regular file"):
        Settings(api_key_file=fifo, state_dir=tmp_path).read_api_keys()
    zero = tmp_path / "keys.link"
    zero.symlink_to("/dev/zero")  # reading it would never end
    with pytest.raises(ConfigError, match="a character device"):
        Settings(api_key_file=zero, state_dir=tmp_path).read_api_keys()


def test_serve_refuses_an_empty_key_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the backend_url does not answer: the old code went on to ask it and failed for that reason instead
    argv = ["serve", "--api-key", "", "--backend-url", "http://127.0.0.1:9", "--state-dir", str(tmp_path)]
    assert main(argv) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("gateway: error: an empty --api-key"), said


def test_the_host_guard_stays_on_when_no_key_is_in_force(engine_url: str) -> None:
    """A gateway given only a blank key serves openly: it must not turn the DNS-rebinding check off."""
    runtime = make_runtime(engine_url, api_keys=("",))
    with TestClient(create_app(runtime), base_url="http://attacker.example:8000") as client:
        rebound = client.get("/status")
    assert rebound.status_code == 403 and "allowed_hosts" in rebound.json()["error"]["message"]
