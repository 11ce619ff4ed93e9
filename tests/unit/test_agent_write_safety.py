"""`gateway agent --write` never turns a valid file into a different one: numbers, NaN and duplicate
keys (JSON and YAML) that would change on the way through are refused, a `.bak` symlink is replaced not
followed, a file changed meanwhile (a second run) or read-only is left alone, and every refusal is one
line. The agent's files are untrusted input (issue 30): only regular files under a size cap are read
(a FIFO, a directory, a link to /dev/zero are refused, never waited on), nesting and YAML aliases are
bounded, and a key of ours holding the wrong type is named with its file, nothing written."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gateway.agents import AGENTS
from gateway.agents.configs import AgentConfig, Served, Target, deep_merge
from gateway.agents.write import plan, write, write_atomically
from gateway.core.errors import ConfigError

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


# -- issue 30: the agent's files are untrusted input ------------------------------------------------------------
SERVED = Served("http://127.0.0.1:8000", "front-model", 32768)


@pytest.fixture
def agent_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every agent's files under tmp_path (its own override variables cleared)."""
    for variable in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "CLINE_PROVIDER_SETTINGS_PATH",
                     "CLINE_DATA_DIR", "CLINE_DIR"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _nothing_written(home: Path, before: set[Path]) -> bool:
    return {path for path in home.rglob("*")} == before


@pytest.mark.timeout(20)  # the old code waited on the FIFO forever and read /dev/zero until memory ran out
@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero-link"])
def test_only_a_regular_file_is_read(agent_home: Path, kind: str) -> None:
    path = agent_home / ".qwen" / "settings.json"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    said = {"fifo": "a FIFO", "directory": "a directory", "dev-zero-link": "a character device"}[kind]
    with (
        _memory_capped(512 * 1024 * 1024),  # the old code's read of /dev/zero ends in MemoryError, not the OOM killer
        pytest.raises(ConfigError, match=f"cannot read {path} \\({said}, not a regular file\\): nothing written"),
    ):
        write("qwen", AGENTS["qwen"](SERVED), yes=True)
    assert not path.with_name("settings.json.bak").exists()


@contextlib.contextmanager
def _memory_capped(extra: int) -> Iterator[None]:
    """This process may map at most ``extra`` more bytes while the block runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_file_over_the_size_cap_is_refused(agent_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["gateway.agents.write"], "MAX_FILE_BYTES", 1000)
    path = agent_home / ".qwen" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"padding": "x" * 1000}))
    with pytest.raises(ConfigError, match="larger than 1,000 bytes"):
        write("qwen", AGENTS["qwen"](SERVED), yes=True)


WRONG_TYPES = [
    # agent, file under home, its text, the key the one line names
    ("qwen", ".qwen/settings.json", {"modelProviders": "x"}, "'modelProviders' holds a string"),
    ("qwen", ".qwen/settings.json", {"modelProviders": {"openai": "abc"}}, "'modelProviders.openai' holds a string"),
    ("qwen", ".qwen/settings.json", {"security": {"auth": 5}}, "'security.auth' holds a number"),
    ("cline", ".cline/data/settings/providers.json", {"providers": 5}, "'providers' holds a number"),
    ("cline", ".cline/data/settings/providers.json", {"providers": {"openai-compatible": []}},
     "'providers.openai-compatible' holds a list"),
    ("cline", ".cline/data/settings/providers.json",
     {"providers": {"openai-compatible": {"settings": "s"}}}, "'providers.openai-compatible.settings' holds a string"),
    ("codex", ".codex/config.toml", 'model_providers = "x"\n', "'model_providers' holds a string"),
    ("claude", ".claude/settings.json", {"env": ["A=1"]}, "'env' holds a list"),
    ("opencode", ".config/opencode/opencode.json", {"provider": {"gateway": True}},
     "'provider.gateway' holds true/false"),
    ("aider", ".aider.model.settings.yml", "- name: openai/front-model\n  extra_params: 3\n",
     "'openai/front-model.extra_params' holds a number"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("agent", "name", "text", "said"), WRONG_TYPES, ids=[f"{a}-{s[:30]}" for a, _, _, s in WRONG_TYPES]
)
def test_a_wrong_type_in_the_agents_file_is_one_line_naming_file_and_key(
    agent_home: Path, agent: str, name: str, text: object, said: str
) -> None:
    path = agent_home / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    before = set(agent_home.rglob("*"))
    with pytest.raises(ConfigError) as refused:
        write(agent, AGENTS[agent](SERVED), yes=True)
    message = str(refused.value)
    assert str(path) in message and said in message
    assert "\n" not in message and _nothing_written(agent_home, before)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("settings.json", '{"a": ' * 5000 + "1" + "}" * 5000),
        ("settings.json", "[" * 5000 + "]" * 5000),
        ("settings.json", '{"a": ' * 80 + "1" + "}" * 80),  # parses, but deeper than any agent's file
        ("config.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n"),
        # 700 levels: past the recursion limit (PyYAML composes each level in 2+ frames); 5,000 took 0.8 s
        ("conf.yml", "a: " + "[" * 700 + "]" * 700 + "\n"),
        ("conf.yml", "a: &a [*a]\n"),  # an alias to itself: endless
        ("conf.yml", "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else '1'}]\n" for n in range(10))),
    ],
    ids=["json-objects", "json-lists", "json-81-deep", "toml", "yaml", "yaml-self-alias", "yaml-billion-laughs"],
)
def test_a_file_nested_too_deep_or_too_wide_is_one_line(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    form = {"json": "json", "toml": "toml", "yml": "yaml"}[name.rsplit(".", 1)[1]]
    target = Target(path, form, lambda old: deep_merge(old, OURS))
    with pytest.raises(ConfigError, match=f"{path} (is nested|holds more than|is not valid TOML)"):
        plan(target)


def test_a_yaml_key_given_twice_is_refused_naming_it(agent_home: Path) -> None:
    path = agent_home / ".aider.conf.yml"
    path.write_text("model: openai/a\ndark-mode: true\nmodel: openai/b\n")
    with pytest.raises(
        ConfigError, match=r"\.aider\.conf\.yml is not valid YAML \(the key 'model' appears twice \(line 3\)\)"
    ):
        write("aider", AGENTS["aider"](SERVED), yes=True)
    assert path.read_text() == "model: openai/a\ndark-mode: true\nmodel: openai/b\n"


def test_a_yaml_merge_key_overridden_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "conf.yml"
    path.write_text("base: &base {a: 1, b: 2}\nmine:\n  <<: *base\n  b: 3\n")
    change = plan(Target(path, "yaml", lambda old: deep_merge(old, OURS)))
    assert change is not None and "b: 3" in change.new


def _expanded_walk(data: Any, max_depth: int, max_values: int) -> str:
    """The shape check's rule read literally: walk every value with the aliases expanded (slow on a
    billion-laughs file, which is why the check measures each shared list or table once)."""
    budget, level = max_values, [(data, 0)]
    while level:
        value, depth = level.pop()
        if depth > max_depth:
            return "refused"
        if isinstance(value, dict | list):
            inner = list(value.values()) if isinstance(value, dict) else value
            budget -= len(inner)
            if budget < 0:
                return "refused"
            level += [(item, depth + 1) for item in inner]
    return "ok"


def test_measuring_shared_values_once_refuses_exactly_what_walking_them_all_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """600 random documents whose lists and tables are shared the way YAML aliases share them, against
    small limits so that both kinds of refusal come up often."""
    shapes = importlib.import_module("gateway.agents.write")
    rng = random.Random(30)

    def document(levels: int, made: list[Any]) -> Any:
        draw = rng.random()
        if levels <= 0 or draw < 0.2:
            return rng.choice([1, "s", [], {}])
        if made and draw < 0.4:
            return rng.choice(made)  # an alias to something already made
        items = [document(levels - 1, made) for _ in range(rng.randint(0, 4))]
        made.append(items if rng.random() < 0.5 else {str(i): item for i, item in enumerate(items)})
        return made[-1]

    seen = set()
    for _ in range(600):
        max_depth, max_values = rng.choice([3, 5, 8]), rng.choice([10, 50, 1000])
        monkeypatch.setattr(shapes, "MAX_DEPTH", max_depth)
        monkeypatch.setattr(shapes, "MAX_VALUES", max_values)
        data = document(rng.randint(1, 12), [])
        try:
            shapes._check_shape(data, Path("f.yml"))
            measured = "ok"
        except ConfigError:
            measured = "refused"
        assert measured == _expanded_walk(data, max_depth, max_values), data
        seen.add(measured)
    assert seen == {"ok", "refused"}
