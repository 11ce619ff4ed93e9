"""How a worker runs a whole engine server for a head on another node (a replica there), engine-neutral.

The head plans the replica as it plans one on this machine (an engine's ``Launch``: its command, its
arguments, its environment with the API key). What crosses to the worker is the arguments after the
command, with the address and port left as :data:`HOST`/:data:`PORT` (the worker binds its own private
address and picks a port free there), and the environment. The worker puts its own installation's
command in front (as it does for a rank of a group, :class:`gateway.backends.base.FollowerHost`) and
keeps only the variables the engine reads (``env_prefixes``): a head's ``LD_PRELOAD`` never reaches it.

The model must be at the same path on both nodes (a shared file system, or the same cache copied): the
arguments name the head's file or directory, and the engine's own "no such file" line comes back to the
head in its log, where the head's supervisor reads it as it reads a local engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HOST = "HOST"  # in the arguments sent: the address the worker binds
PORT = "PORT"  # in the arguments sent: the port the worker picked


@dataclass(frozen=True)
class ServerHost:
    """One engine's server as a worker runs it: which flags carry the address and port, and which of the
    head's variables it may get."""

    engine: str  # the backend's name
    title: str  # its server, for the worker's log and refusals
    inherit: tuple[str, ...]  # the engine's own variable families kept from the worker's environment
    env_prefixes: tuple[str, ...]  # the head's variables the worker passes on (its key, its device choice)
    host_flag: str = "--host"
    port_flag: str = "--port"

    def args(self, argv: Sequence[str], command: Sequence[str]) -> tuple[str, ...]:
        """The head's side (pure): ``argv`` without the head's ``command`` in front, the values of the
        address and port flags as :data:`HOST` and :data:`PORT`."""
        words = list(argv)
        if command and words[: len(command)] == list(command):
            words = words[len(command) :]
        for flag, placeholder in ((self.host_flag, HOST), (self.port_flag, PORT)):
            if flag in words and words.index(flag) + 1 < len(words):
                words[words.index(flag) + 1] = placeholder
            else:
                words += [flag, placeholder]
        return tuple(words)

    def argv(self, command: Sequence[str], args: Sequence[str], host: str, port: int) -> list[str]:
        """The worker's side (pure): its own ``command``, the head's ``args`` with the placeholders filled."""
        filled = {HOST: host, PORT: str(port)}
        return [*command, *(filled.get(word, word) for word in args)]

    def env(self, sent: Mapping[str, str]) -> dict[str, str]:
        """The head's variables this engine reads; the others are dropped."""
        return {name: value for name, value in sent.items() if name.startswith(self.env_prefixes)}
