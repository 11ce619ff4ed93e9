"""The fast suite's habits that keep it fast and steady (issue 51): a module named to start first still
exists, and every sleep in the tests and their stand-ins says why it is there (a stand-in's pace, an input
the test times, the pause between looks of a wait with a deadline), so that a bare sleep standing in for a
wait shows up in review. Waits belong in tests/waiting.py; speed figures belong in docs/contributing.md."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import LONGEST_MODULES

ROOT = Path(__file__).resolve().parents[2]
SLEEP = re.compile(r"\b(?:time|asyncio)\.sleep\((?!0\))")  # asyncio.sleep(0) only yields to the loop


def _sleeps_without_a_reason(path: Path) -> list[str]:
    """Lines of ``path`` that sleep (longer than 0) with no comment on that line or the one above."""
    lines = path.read_text().splitlines()
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in enumerate(lines, start=1)
        if SLEEP.search(line) and "#" not in line and "#" not in (lines[number - 2] if number > 1 else "")
    ]


def test_the_modules_named_to_start_first_exist() -> None:
    """A renamed module would silently go back to the end of the queue, where a long one keeps one worker
    busy after the other has finished."""
    assert [name for name in LONGEST_MODULES if not (ROOT / name).is_file()] == []


def test_every_sleep_in_the_tests_says_why() -> None:
    places = [*(ROOT / "tests").glob("*.py"), *(ROOT / "tests" / "unit").glob("*.py")]
    places += (ROOT / "tests" / "integration" / "tools").glob("*.py")
    bare = [line for path in sorted(places) for line in _sleeps_without_a_reason(path)]
    assert bare == [], "a sleep with no comment (a wait? use tests/waiting.py):\n" + "\n".join(bare)
