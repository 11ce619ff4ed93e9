"""A model package's file (gateway/backends/llamacpp/artifacts.py): verified by the package once per process,
again whenever the file changed since, and assembled by one gateway of the machine at a time."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from gateway.backends.llamacpp import artifacts
from gateway.core.errors import ModelError


@pytest.fixture
def package(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A stand-in model package whose assemble() records each call (the real one hashes 250 MB); its
    file stays half written for the seconds a test gives as the fixture's param (none by default)."""
    calls: list[Path] = []
    target = tmp_path / "model.gguf"
    half_written_s = float(getattr(request, "param", 0.0))

    def assemble() -> Path:
        if target.exists() and target.read_bytes() != b"GGUF-good":
            raise ValueError("sha256 mismatch")
        if not target.exists():  # written in place, as the real package does: half of it for a moment
            with target.open("wb") as out:
                out.write(b"GGUF")
                out.flush()
                time.sleep(half_written_s)  # the half-written moment, the test's input
                out.write(b"-good")
        calls.append(target)
        return target

    module = types.ModuleType("stand_in_model_gguf")
    module.assemble = assemble  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stand_in_model_gguf", module)
    monkeypatch.setattr(artifacts, "_ASSEMBLED", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the lock file lives
    return calls


def test_an_unchanged_file_is_verified_once_and_a_changed_one_again(package: list[Path]) -> None:
    path = artifacts.from_package("stand_in_model_gguf", "stand-in-model-gguf")
    assert artifacts.from_package("stand_in_model_gguf", "stand-in-model-gguf") == path
    assert len(package) == 1
    path.write_bytes(b"GGUF-bad!")  # changed on disk since: the package's check runs again and refuses it
    with pytest.raises(ModelError, match="could not assemble its GGUF"):
        artifacts.from_package("stand_in_model_gguf", "stand-in-model-gguf")
    path.unlink()  # gone: assembled again
    assert artifacts.from_package("stand_in_model_gguf", "stand-in-model-gguf") == path
    assert len(package) == 2


@pytest.mark.parametrize("package", [0.1], indirect=True)  # half written for 0.1 s: the other thread starts within it
def test_two_gateways_starting_at_once_wait_for_one_assembly(package: list[Path]) -> None:
    """Without the lock the second reads the file half written, fails the package's checksum and refuses
    to start (two workers of the test suite, two gateways on one machine)."""
    results: list[Path | Exception] = []

    def start() -> None:
        try:
            results.append(artifacts.from_package("stand_in_model_gguf", "stand-in-model-gguf"))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assembled = [result for result in results if isinstance(result, Path)]
    assert len(assembled) == 2, results
    assert assembled[0].read_bytes() == b"GGUF-good"
