"""Lint, format and strict typing are part of the suite, so the one test command checks them too."""

from __future__ import annotations

import re
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


def test_http_clients_are_made_in_one_place() -> None:
    """Every client of the gateway's ignores the environment's proxy and shares one TLS context: made by
    gateway/core/tls.py, never by hand (eight copies of the same arguments once drifted apart)."""
    made_by_hand = re.compile(r"\bhttpx\.(Client|AsyncClient|get|post|stream|request)\(")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("gateway", "backends")
        for path in (ROOT / package).rglob("*.py")
        if path != ROOT / "gateway" / "core" / "tls.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if made_by_hand.search(line)
    ]
    assert not offenders, f"use gateway.core.tls.http_client / async_http_client / http_get: {offenders}"
