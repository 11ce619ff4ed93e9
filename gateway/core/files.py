"""Files the gateway keeps or reads beside the user's own.

Writing: a crash or a full disk never leaves a file half-written (the text goes to a temporary file
beside it, is flushed to disk, and replaces the file in one ``os.replace``). Reading a small file the
user or another program controls (an agent's settings, a key file, the remembered configurations):
only a regular file, and only up to a cap."""

from __future__ import annotations

import errno
import os
import stat
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


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` when it is a regular file (after symlinks) of at most ``limit`` bytes; an
    OSError whose ``strerror`` says why not.

    Opened non-blocking and checked on the open descriptor, not by name first: a FIFO put where a
    config file was would block ``open`` and ``read`` forever, a symlink to ``/dev/zero`` never ends,
    and a name checked before it is opened can be swapped in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        with os.fdopen(os.dup(fd), "rb") as stream:
            data = stream.read(limit + 1)  # a file that grows while it is read stops at the cap too
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data
