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
