"""A model package's file (backends/llamacpp/artifacts.py): verified by the package once per process,
and again whenever the file changed since."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from backends.llamacpp import artifacts
from gateway.core.errors import ModelError


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A stand-in model package whose assemble() records each call (the real one hashes 250 MB)."""
    calls: list[Path] = []
    target = tmp_path / "model.gguf"

    def assemble() -> Path:
        if target.exists() and target.read_bytes() != b"GGUF-good":
            raise ValueError("sha256 mismatch")
        target.write_bytes(b"GGUF-good")
        calls.append(target)
        return target

    module = types.ModuleType("stand_in_model_gguf")
    module.assemble = assemble  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stand_in_model_gguf", module)
    monkeypatch.setattr(artifacts, "_ASSEMBLED", {})
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
