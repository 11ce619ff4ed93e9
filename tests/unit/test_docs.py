"""The front door and the manual stay true: the README is short and reaches every page of the manual in one
click, the manual builds without a broken link, every setting is documented, and CI runs the README's test
command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.cli.flags import settings_table
from gateway.cli.full_settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
README_MAX_LINES = 250


def _fenced_after(heading: str) -> str:
    section = README.split(heading, 1)[1]
    match = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    assert match, f"no bash block after {heading!r}"
    return match.group(1).strip()


def test_the_configuration_page_holds_the_table_generated_from_the_settings() -> None:
    page = (DOCS / "configuration.md").read_text()
    assert settings_table() in page, "docs/configuration.md's table is stale: paste `python -m gateway.cli.flags`"
    assert all(f"| `{name}` |" in settings_table() for name in Settings.model_fields)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = _fenced_after("## Test it")
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert command in ci_script.splitlines()


def test_the_run_command_installs_and_serves() -> None:
    command = _fenced_after("## Run it")
    assert "pip install" in command and command.endswith("gateway serve")


def test_the_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES, "move reference text into docs/, keep the README short"


def _nav_pages(nav: list[object]) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_every_page_of_the_manual_is_in_its_navigation_and_one_click_from_the_readme() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert set(_nav_pages(config["nav"])) == pages
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README))
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def test_the_manual_builds_strict(tmp_path: Path) -> None:
    """A broken link, a missing anchor or a page outside the navigation fails the build (mkdocs.yml)."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "plan" / "index.html").is_file()
