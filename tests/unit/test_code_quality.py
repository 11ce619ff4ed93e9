"""Lint, format and strict typing are part of the suite, so the one test command checks them too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
        ["hadolint", "Dockerfile"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict", "hadolint"],
)
def test_tool_is_clean(command: list[str]) -> None:
    argv = (
        [str(Path(sys.executable).parent / command[0]), *command[1:]]
        if command[0] == "hadolint"
        else [sys.executable, "-m", *command]
    )
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
