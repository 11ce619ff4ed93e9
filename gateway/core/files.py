"""Writing a file so that a crash or a full disk never leaves it half-written: the text goes to a
temporary file beside it, is flushed to disk, and replaces the file in one ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """``path`` now holds ``text`` (with ``mode``), or, if anything failed, what it held before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def inside(root: Path, path: Path, what: str = "") -> Path:
    """``path``, made absolute and normal, when it stays under ``root``: a name from elsewhere (a hub's
    ETag, a listing's file name) whose ``..`` or ``/`` leads out raises ModelError. Symlinks are not
    followed: the cache's own snapshot links may point wherever its owner keeps the blobs."""
    from gateway.core.errors import ModelError

    normal, top = Path(os.path.normpath(path.absolute())), Path(os.path.normpath(root.absolute()))
    if not normal.is_relative_to(top):
        raise ModelError(f"{what or path.name[:80]!r} would be written outside {root}: refused")
    return normal
