"""`gateway agent NAME --write`: merge the configuration into the files the agent reads.

The user's own keys stay (each file is parsed, our part laid over it, and written back); the diff is shown
before anything changes, a TTY is asked and anything else needs --yes; the write is atomic (temp file +
os.replace in the same directory) and the previous version is kept beside it as ``<file>.bak``.

Each file is read as untrusted input: only a regular file of at most ``MAX_FILE_BYTES`` (a FIFO at the
path would hang the read, a link to /dev/zero would fill memory), nested at most ``MAX_DEPTH`` deep, with
no key given twice (YAML, like JSON, would keep only the last), and a key of ours that holds the wrong type
in the file (``"modelProviders": "x"``) is named rather than overwritten. Every file is checked before
any is written: one that fails leaves them all as they were.
"""

from __future__ import annotations

import difflib
import json
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import yaml  # type: ignore[import-untyped,unused-ignore]  # PyYAML comes with uvicorn[standard] and huggingface_hub

from gateway.agents.configs import LIST_KEY, AgentConfig, Doc, Target, WrongType
from gateway.core import exact_json
from gateway.core.errors import ConfigError
from gateway.core.files import exclusive, lock_for, read_regular_file, replace_atomically

MAX_FILE_BYTES = 8 * 1024 * 1024  # agents' settings files are kilobytes
MAX_DEPTH = 64  # levels of nesting; agents' files use a handful
MAX_VALUES = 1_000_000  # values in one file; agents' files hold hundreds


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc,unused-ignore]
    """PyYAML's safe loader, refusing a mapping that gives a key twice (it would keep only the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then overriding a key is YAML's own idiom
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: the base constructor says so
                continue
            if repeated:
                line = key_node.start_mark.line + 1
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} appears twice (line {line})")
            seen.add(key)
        return dict(super().construct_mapping(node, deep=deep))


def _strict_json(text: str) -> Any:
    """JSON that can be written back exactly as it means: no NaN/Infinity, no numbers that overflow to
    infinity, no duplicate keys (each would silently change on the way through)."""
    return exact_json.loads(text, unique_keys=True)


def parse(text: str, format: str, path: Path) -> Doc:
    """The document in ``text``, as the agent would read it; an empty file is an empty document. A
    ``yaml-list`` file (a YAML list at the top, like aider's model settings) is ``{"entries": [...]}``."""
    if not text.strip():
        return {}
    kind = "YAML" if format == "yaml-list" else format.upper()
    try:
        if format == "toml":
            data: Any = tomllib.loads(text)
        else:
            data = _strict_json(text) if format == "json" else yaml.load(text, Loader=_UniqueKeyLoader)
    except (tomllib.TOMLDecodeError, ValueError, yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path} is not valid {kind} ({reason}): fix it or edit it by hand") from exc
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be an agent's settings: fix it or edit it by hand") from None
    _check_shape(data, path)
    if data is None:
        return {}
    if format == "yaml-list":
        if not isinstance(data, list):
            raise ConfigError(f"{path} holds a {type(data).__name__}, not a YAML list: edit it by hand")
        return {LIST_KEY: data}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a {format.upper()} table: edit it by hand")
    return data


def _check_shape(data: Any, path: Path) -> None:
    """At most ``MAX_DEPTH`` levels of lists and tables and ``MAX_VALUES`` values, counted as the agent
    would see them with every YAML alias expanded (aliases can make a 1 KB file a billion values), walked
    without recursion. Each list or table is measured once, however many aliases point to it: walking
    the expanded values took a second for a billion-laughs file; one that holds itself is endlessly deep."""
    measured: dict[int, tuple[int, int]] = {}  # id of a list or table -> (levels below it, values in it)
    open_: set[int] = set()  # on the path being walked: meeting one again is a loop
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        value, children_done = stack.pop()
        if not isinstance(value, dict | list):
            continue
        inner = list(value.values()) if isinstance(value, dict) else value
        nested = [item for item in inner if isinstance(item, dict | list)]
        if not children_done:
            if id(value) in measured:
                continue
            if id(value) in open_:
                raise ConfigError(f"{path} is nested more than {MAX_DEPTH} levels deep: fix it or edit it by hand")
            open_.add(id(value))
            stack.append((value, True))
            stack += [(item, False) for item in nested if id(item) not in measured]
            continue
        open_.discard(id(value))
        levels = 1 + max((measured[id(item)][0] for item in nested), default=0) if inner else 0
        values = len(inner) + sum(measured[id(item)][1] for item in nested)
        if levels > MAX_DEPTH:
            raise ConfigError(f"{path} is nested more than {MAX_DEPTH} levels deep: fix it or edit it by hand")
        if values > MAX_VALUES:
            raise ConfigError(f"{path} holds more than {MAX_VALUES:,} values (YAML aliases?): edit it by hand")
        measured[id(value)] = (levels, values)


def _read_text(path: Path) -> str | None:
    """The file's text, None when it does not exist; a ConfigError when it cannot be one of ours."""
    try:
        return read_regular_file(path, MAX_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): fix it or edit it by hand") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror}): nothing written") from exc


def dump(doc: Doc, format: str) -> str:
    """``doc`` in the file's format (comments in the old file do not survive: the diff shows it)."""
    if format == "toml":
        return tomli_w.dumps(doc)
    if format == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    data = doc.get(LIST_KEY, []) if format == "yaml-list" else doc
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True))


@dataclass(frozen=True)
class Change:
    """One file's planned change: its text before (None when absent) and after."""

    target: Target
    old: str | None
    new: str

    def diff(self) -> str:
        name = str(self.target.path)
        before = (self.old or "").splitlines(keepends=True)
        lines = difflib.unified_diff(before, self.new.splitlines(keepends=True),
                                     "/dev/null" if self.old is None else name, name)  # fmt: skip
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def plan(target: Target) -> Change | None:
    """What writing ``target`` would change; None when the file already says what we would write."""
    path = target.path
    old = _read_text(path)
    before = parse(old, target.format, path) if old is not None else {}
    try:
        after = target.merge(before)
    except WrongType as exc:
        raise ConfigError(f"{path}: {exc}: fix or remove it, then run again; nothing written") from None
    if old is not None and after == before:
        return None
    return Change(target, old, dump(after, target.format))


def write_atomically(path: Path, text: str, expected: str | None = None) -> None:
    """Replace ``path`` in one step, keeping the old version as ``<file>.bak`` and the old mode.

    Under a lock on the directory, and only if the file still holds ``expected`` (what the diff was
    made from): two runs at once would otherwise back up each other's output and lose the original.
    The backup is itself replaced atomically, so a ``.bak`` that is a symlink is replaced, not followed.
    A read-only file is refused rather than replaced behind its mode."""
    if path.is_symlink():  # a dotfile kept elsewhere and linked: write the file, not over the link
        path = path.resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(lock_for(path.parent)):  # its lock file in the gateway's cache, not among the user's
            current = _read_text(path)
            if current != expected:
                raise ConfigError(f"{path} changed since the diff was shown: nothing written; run again")
            if current is not None:
                mode = path.stat().st_mode & 0o777
                if not mode & 0o200:
                    raise ConfigError(f"{path} is read-only (mode {mode:o}): nothing written; chmod u+w it first")
                replace_atomically(path.with_name(path.name + ".bak"), current, mode)
            replace_atomically(path, text, mode if current is not None else 0o600)  # these files may hold a key
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise ConfigError(f"cannot write {path} ({why}): nothing changed") from exc


def _ask_on_tty(question: str) -> bool:
    try:
        return input(question).strip().lower() in {"y", "yes"}
    except EOFError:  # Ctrl-D is a no
        return False


def write(
    name: str,
    config: AgentConfig,
    *,
    yes: bool,
    interactive: bool | None = None,
    confirm: Callable[[str], bool] = _ask_on_tty,
) -> int:
    """Show the diff of every file ``config`` goes in, then write them (asked on a TTY, else only with --yes)."""
    if not config.targets:
        print(f"{name} reads its configuration only from environment variables: nothing to write. Run:")
        print(config.text, end="")
        return 0
    changes = [change for change in map(plan, config.targets) if change is not None]
    if not changes:
        print(f"{name}: already up to date ({', '.join(str(t.path) for t in config.targets)})")
        return 0
    for change in changes:
        print(change.diff(), end="")
    if not yes:
        if not (sys.stdin.isatty() if interactive is None else interactive):
            raise ConfigError("not a terminal to confirm on: nothing written; rerun with --yes to write the diff above")
        if not confirm(f"Write {len(changes)} file(s)? [y/N] "):
            print("nothing written")
            return 1
    for change in changes:
        had = change.old is not None
        write_atomically(change.target.path, change.new, change.old)
        backup = f" (previous version in {change.target.path.name}.bak)" if had else ""
        print(f"wrote {change.target.path}{backup}")
    for note in config.notes:
        print(f"then: {note}")
    return 0
