"""Every `gateway …` command written in the README and the manual parses against the CLI: a flag renamed
or removed under the docs fails here, not in a newcomer's terminal."""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from pathlib import Path

import pytest

from gateway.cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# what the docs write where a reader fills in their own value; each stands for a value the parser accepts
PLACEHOLDERS = {"NAME": "codex", "<agent>": "codex"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"(?<!`)`(gateway [^`]+)`(?!`)")
SHELLS = {"bash", "sh", "shell", "console"}


def _commands_in_shell(block: str) -> list[str]:
    """`gateway …` invocations in a shell block: continuation lines joined, each command of a `&&`, `;` or `|`
    chain on its own, environment assignments and a venv's path in front dropped, comments cut."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        for part in re.split(r"&&|\|\||;|\|", line):
            words = part.split("#", 1)[0].split()
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                words.pop(0)
            if words and Path(words[0]).name == "gateway":
                found.append(" ".join(["gateway", *words[1:]]))
    return found


def documented_commands(text: str) -> list[str]:
    commands = []
    for language, body in FENCE.findall(text):
        if language in SHELLS:
            commands += _commands_in_shell(body)
    prose = FENCE.sub("", text)
    commands += [" ".join(match.group(1).split()) for match in INLINE.finditer(prose)]
    return commands


def _cases() -> list[tuple[str, str]]:
    cases = []
    for document in DOCUMENTS:
        for command in documented_commands(document.read_text()):
            cases.append((document.relative_to(ROOT).as_posix(), command))
    return cases


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One parser for every case: parsing leaves it as it was, and building it took most of each case's time."""
    return build_parser()


def _parses(argv: list[str]) -> str | None:
    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else f"exit {exc.code}"
    return None


def parse_error(command: str) -> str | None:
    """What the CLI's parser says of a documented command (None: it parses). An elision (…) stands for a
    value of the reader's; prose may name a subcommand alone or end on a flag whose value it leaves out."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    try:
        argv = [("x" if word in ("…", "...") else word) for word in shlex.split(command.replace("…", " … "))][1:]
    except ValueError as exc:
        return f"not a shell line: {exc}"
    if len(argv) == 1 and argv[0] in _subcommands():
        return None
    error = _parses(argv)
    if error and argv and argv[-1].startswith("--") and _parses([*argv, "x"]) is None:
        return None
    return error


def _subcommands() -> set[str]:
    parser = _parser()
    return {name for action in parser._subparsers._group_actions for name in action.choices}  # type: ignore[union-attr]


@pytest.mark.parametrize(("document", "command"), _cases())
def test_a_documented_command_parses(document: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    error = parse_error(command)
    assert error is None, f"{document}: `{command}` does not parse ({error}): {capsys.readouterr().err.strip()}"


def test_the_documents_hold_commands_to_check() -> None:
    assert len(_cases()) >= 20, "the extractor found almost no commands: its patterns no longer match the docs"


def test_a_renamed_flag_is_caught() -> None:
    assert parse_error("gateway serve --model smollm2-135m-instruct") is None
    assert parse_error("gateway serve --modle smollm2-135m-instruct") is not None
    assert parse_error("gateway agent codex --write --yes") is None
    assert parse_error("gateway agent notanagent") is not None


def test_the_extractor_reads_chains_continuations_and_inline_code() -> None:
    text = (
        "Run `gateway plan --json` first.\n\n```bash\nGATEWAY_PORT=9 .venv/bin/gateway serve \\\n  --port 8001"
        ' && curl x | gateway models  # list\n```\n\n```json\n{"a": "gateway serve --nope"}\n```\n'
    )
    assert documented_commands(text) == ["gateway serve --port 8001", "gateway models", "gateway plan --json"]


# a bash block holding one `gateway plan …` and, right after it, the plain block of what it prints
PRINTED = re.compile(r"```bash\n(?:\.venv/bin/)?(gateway plan [^\n]+)\n```\n\n```\n(.*?)```", re.DOTALL)


def _printed_cases() -> list[tuple[str, str, str]]:
    return [
        (document.relative_to(ROOT).as_posix(), match.group(1), match.group(2))
        for document in DOCUMENTS
        for match in PRINTED.finditer(document.read_text())
    ]


def test_the_docs_show_plan_outputs_to_check() -> None:
    assert any(command.startswith("gateway plan --model glm-4.7-flash") for _, command, _ in _printed_cases())


@pytest.mark.parametrize(("document", "command", "shown"), _printed_cases())
def test_a_documented_plan_prints_what_the_docs_show(
    document: str, command: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the docs show as a plan's output is what the command prints today (as on a machine with
    llama-server installed: the launcher pinned, since this one may have only llama-cpp-python)."""
    from gateway.cli.commands import main

    argv = [*shlex.split(command)[1:], "--llama-launcher", "native"]
    main(argv)
    printed = capsys.readouterr().out
    assert printed.strip() == shown.strip(), f"{document}: paste the output of `{command}` again"
