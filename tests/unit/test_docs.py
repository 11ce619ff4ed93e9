"""The README stays true: every setting is documented and CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.cli.flags import settings_table
from gateway.cli.full_settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _fenced_after(heading: str) -> str:
    section = README.split(heading, 1)[1]
    match = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    assert match, f"no bash block after {heading!r}"
    return match.group(1).strip()


def test_the_configuration_table_is_the_one_generated_from_the_settings() -> None:
    assert settings_table() in README, "README's table is stale: paste `python -m gateway.cli.flags`"
    assert all(f"| `{name}` |" in settings_table() for name in Settings.model_fields)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = _fenced_after("## Test it")
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert command in ci_script.splitlines()


def test_the_run_command_installs_and_serves() -> None:
    command = _fenced_after("## Run it")
    assert "pip install" in command and command.endswith("gateway serve")
