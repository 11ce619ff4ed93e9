"""Files the gateway keeps or reads beside the user's own.

Writing: a crash or a full disk never leaves a file half-written (the text goes to a temporary file
beside it, is flushed to disk, and replaces the file in one ``os.replace``). Reading a small file the
user or another program controls (an agent's settings, a key file, the remembered configurations):
only a regular file, and only up to a cap.

Several processes of one machine share some files (every gateway the remembered configurations and
the model caches, two ``gateway agent --write`` an agent's settings): whoever reads a file, changes it
and writes it back holds :func:`exclusive` for the whole of it, or two at once each write what they
read and one change is lost. One lock for every such writer (hub downloads, packaged models, agents'
files, the remembered store): ``filelock``'s, an ``flock`` on a lock file, which the kernel releases
when its process dies, so a crash leaves no lock held."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import BaseFileLock, FileLock, SoftFileLock, Timeout

log = logging.getLogger("gateway.files")

LOCK_LOG_EVERY_S = 10.0  # a wait for another process is said this often


def cache_dir() -> Path:
    """Where the gateway keeps what it fetches and builds: ``$XDG_CACHE_HOME/gateway`` (``~/.cache/gateway``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gateway"


def lock_for(path: Path) -> Path:
    """The lock file for a file or folder that is not the gateway's own (an agent's settings): in the
    gateway's cache, named after the path's resolved name, so nothing is left beside the user's files."""
    resolved = str(path.resolve())
    digest = hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return cache_dir() / "locks" / f"{path.name[:40] or 'root'}-{digest}.lock"


@contextlib.contextmanager
def exclusive(lock: Path, *, wait_s: float | None = None) -> Iterator[None]:
    """The block runs while no other process of this machine runs a block of its own on ``lock`` (a
    lock file, created if needed and kept: removing it would let a third process lock a new file of the
    same name while a second still holds the old one). ``wait_s``: how long to wait for the holder
    (None: as long as it holds it, said in the log every ``LOCK_LOG_EVERY_S``); past it an OSError
    (ETIMEDOUT). Not reentrant: a block must not take the same lock again."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = _acquire(lock, wait_s)
    try:
        yield
    finally:
        held.release()


def _acquire(lock: Path, wait_s: float | None) -> BaseFileLock:
    held: BaseFileLock = FileLock(lock)
    started = time.monotonic()
    while True:
        left = None if wait_s is None else wait_s - (time.monotonic() - started)
        try:
            held.acquire(timeout=LOCK_LOG_EVERY_S if left is None else max(0.0, min(left, LOCK_LOG_EVERY_S)))
            return held
        except Timeout:
            if left is not None and left <= LOCK_LOG_EVERY_S:
                raise OSError(errno.ETIMEDOUT, f"held by another process for over {wait_s:g} s", str(lock)) from None
            log.info("waiting for another process that holds %s (%.0f s so far)", lock, time.monotonic() - started)
        except NotImplementedError:  # a file system without flock (some network mounts)
            log.warning("%s: the file system has no flock; locking by the file's existence instead", lock)
            held = SoftFileLock(lock)


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
