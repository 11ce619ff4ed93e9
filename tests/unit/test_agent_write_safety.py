"""`gateway agent --write` never turns a valid file into a different one: numbers, NaN and duplicate
keys that would change on the way through are refused, a `.bak` symlink is replaced not followed, a
file changed meanwhile (a second run) or read-only is left alone, and every refusal is one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.agents.configs import AgentConfig, Target, deep_merge
from gateway.agents.write import plan, write, write_atomically
from gateway.errors import ConfigError

OURS = {"model": {"name": "front-model"}}


def _config(path: Path) -> AgentConfig:
    return AgentConfig(str(path), "", "json", (Target(path, "json", lambda old: deep_merge(old, OURS)),))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"limit": 1e400}\n', "out of range"),
        ('{"limit": NaN}\n', "NaN"),
        ('{"a": 1, "a": 2}\n', "twice"),
        (b'{"a": "\xff"}\n', "not UTF-8"),
    ],
)
def test_a_file_that_would_change_on_the_way_through_is_refused(tmp_path: Path, text: str | bytes, said: str) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=said):
        write("qwen", _config(path), yes=True)
    assert path.read_bytes() == before and not path.with_name("settings.json.bak").exists()


def test_a_bak_that_is_a_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    path, elsewhere = tmp_path / "settings.json", tmp_path / "precious.txt"
    path.write_text('{"theme": "dark"}\n')
    elsewhere.write_text("do not touch\n")
    path.with_name("settings.json.bak").symlink_to(elsewhere)
    assert write("qwen", _config(path), yes=True) == 0
    backup = path.with_name("settings.json.bak")
    assert elsewhere.read_text() == "do not touch\n"
    assert not backup.is_symlink() and backup.read_text() == '{"theme": "dark"}\n'


def test_a_file_changed_since_the_diff_is_not_written_and_its_backup_kept(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "dark"}\n')
    change = plan(_config(path).targets[0])
    assert change is not None
    path.write_text('{"theme": "light"}\n')  # a second run wrote meanwhile
    with pytest.raises(ConfigError, match="changed since"):
        write_atomically(path, change.new, change.old)
    assert path.read_text() == '{"theme": "light"}\n'


def test_a_read_only_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "dark"}\n')
    os.chmod(path, 0o444)
    with pytest.raises(ConfigError, match="read-only"):
        write("qwen", _config(path), yes=True)
    assert path.read_text() == '{"theme": "dark"}\n'


def test_an_unwritable_directory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    module = sys.modules["gateway.agents.write"]  # the package's `write` is the function
    monkeypatch.setattr(module, "replace_atomically", denied)  # root ignores a directory's mode
    path = tmp_path / "settings.json"
    with pytest.raises(ConfigError, match="cannot write .*Permission denied"):
        write("qwen", _config(path), yes=True)
