"""The head's request to a worker to start one rank of an engine group (``POST /group/start``): one type
that the head writes (gateway/nodes/group.py) and the worker reads back (gateway/nodes/followers.py).

The worker reads it as input that may be hostile (a key holder's, or a head of another version): every
field is checked and bounded before anything is stopped or started, so that a bad request is a 400 that
names the field and the running rank is kept. Unbounded, a rank of 300 digits made a log file name the
file system refused, and a 10 MB argument an ``execve`` the kernel refused (E2BIG): each a 500, after
the running rank had been stopped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

MAX_LEASE_S = 600.0
MAX_RANK = 4095  # a group's ranks: one per node
MAX_ARGS = 1024
MAX_ARG_BYTES = 64 * 1024  # Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN)
MAX_NAME_CHARS = 256  # the engine, its version, the address
MAX_BODY_BYTES = 1 << 20  # the whole request (a head's is a few kB); all arguments stay under ARG_MAX (2 MiB)
MAX_BODY_ELEMENTS = MAX_ARGS + 16  # JSON objects and arrays in it: one object, one list (and its env)


class FollowerState(enum.StrEnum):
    """The worker's rank as ``/group``, ``/group/lease`` and ``/group/stop`` answer it (``"state"``)."""

    NONE = "none"  # never started, or its start was refused
    RUNNING = "running"
    EXITED = "exited"  # with its status, why, and its last lines

    @classmethod
    def read(cls, value: Any) -> FollowerState | None:
        """The state a worker answered; None for what names none (a worker of another version)."""
        try:
            return cls(value)
        except ValueError:
            return None


class Refused(Exception):
    """A start the worker will not do; ``status`` is the HTTP status the head gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StartRequest:
    engine: str
    version: str
    rank: int
    args: tuple[str, ...]
    host_ip: str  # the worker's address as the head reached it
    lease_s: float

    def to_json(self) -> dict[str, Any]:
        """What the head sends."""
        return {
            "engine": self.engine,
            "version": self.version,
            "rank": self.rank,
            "args": list(self.args),
            "host_ip": self.host_ip,
            "lease_s": self.lease_s,
        }

    @classmethod
    def from_json(cls, data: Any) -> StartRequest:
        """The head's request, checked field by field (Refused 400 with the field's name and its bound)."""
        if not isinstance(data, dict):
            raise Refused(400, "the body must be a JSON object")
        args = data.get("args")
        if not isinstance(args, list) or not all(isinstance(a, str) and "\x00" not in a for a in args):
            raise Refused(400, "args: a list of strings")
        if len(args) > MAX_ARGS:
            raise Refused(400, f"args: at most {MAX_ARGS} arguments, not {len(args)}")
        if any(len(a.encode("utf-8", "surrogatepass")) > MAX_ARG_BYTES for a in args):
            raise Refused(400, f"args: each argument at most {MAX_ARG_BYTES} bytes")
        for name in ("engine", "version", "host_ip"):
            value = data.get(name)
            if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or not value.isprintable():
                raise Refused(400, f"{name}: a non-empty printable string of at most {MAX_NAME_CHARS} characters")
        rank, lease = data.get("rank"), data.get("lease_s")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
            raise Refused(400, f"rank: an integer from 1 to {MAX_RANK} (rank 0 is the head)")
        if not isinstance(lease, int | float) or isinstance(lease, bool) or not 1 <= lease <= MAX_LEASE_S:
            raise Refused(400, f"lease_s: seconds from 1 to {MAX_LEASE_S:g}")
        return cls(data["engine"], data["version"], rank, tuple(args), data["host_ip"], float(lease))


MAX_ENV = 64  # variables a head sends with a whole server (its key, its devices, the engine's knobs)
REPLICA_NAME = r"[A-Za-z0-9_-]{1,32}"  # the head's name for a replica: a part of its log file's name
MAX_REPLICAS_HERE = 16  # whole servers one worker runs at once (one per replica the head put here)


@dataclass(frozen=True)
class ServerStart:
    """The head's request to a worker to run a whole engine server, one replica (``POST /replica/start``):
    the engine's arguments after its command with the address and port left to the worker
    (:mod:`gateway.backends.server_host`), its environment, and the lease that ends it when the head is gone.
    Checked and bounded as :class:`StartRequest` is, before anything runs."""

    replica: str  # the head's name for it ("2"): a later start of the same name replaces it
    engine: str
    version: str
    args: tuple[str, ...]
    env: dict[str, str]
    lease_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "engine": self.engine,
            "version": self.version,
            "args": list(self.args),
            "env": dict(self.env),
            "lease_s": self.lease_s,
        }

    @classmethod
    def from_json(cls, data: Any) -> ServerStart:
        """The head's request, checked field by field (Refused 400 with the field's name and its bound)."""
        if not isinstance(data, dict):
            raise Refused(400, "the body must be a JSON object")
        args = _args(data.get("args"))
        env = data.get("env")
        if not isinstance(env, dict) or len(env) > MAX_ENV:
            raise Refused(400, f"env: an object of at most {MAX_ENV} variables")
        for name, value in env.items():
            if not (name.isidentifier() and len(name) <= MAX_NAME_CHARS) or not _arg_like(value):
                raise Refused(400, f"env: names are identifiers, values strings of at most {MAX_ARG_BYTES} bytes")
        for name in ("engine", "version"):
            _name(name, data.get(name))
        replica = data.get("replica")
        if not isinstance(replica, str) or not re.fullmatch(REPLICA_NAME, replica):
            raise Refused(400, "replica: 1 to 32 letters, digits, '-' or '_' (the head's name for it)")
        lease = data.get("lease_s")
        if not isinstance(lease, int | float) or isinstance(lease, bool) or not 1 <= lease <= MAX_LEASE_S:
            raise Refused(400, f"lease_s: seconds from 1 to {MAX_LEASE_S:g}")
        return cls(data["replica"], data["engine"], data["version"], args, dict(env), float(lease))


def _arg_like(value: Any) -> bool:
    if not isinstance(value, str) or "\x00" in value:
        return False
    return len(value.encode("utf-8", "surrogatepass")) <= MAX_ARG_BYTES


def _args(args: Any) -> tuple[str, ...]:
    if not isinstance(args, list) or not all(isinstance(a, str) and "\x00" not in a for a in args):
        raise Refused(400, "args: a list of strings")
    if len(args) > MAX_ARGS:
        raise Refused(400, f"args: at most {MAX_ARGS} arguments, not {len(args)}")
    if not all(_arg_like(a) for a in args):
        raise Refused(400, f"args: each argument at most {MAX_ARG_BYTES} bytes")
    return tuple(args)


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise Refused(400, f"{field}: a non-empty printable string of at most {MAX_NAME_CHARS} characters")
    return value
