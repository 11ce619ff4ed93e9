"""The gateway's listening socket, taken before anything starts: a busy port is one clear line, at once."""

from __future__ import annotations

import errno
import socket

from gateway.core.errors import GatewayError


def bind_listener(host: str, port: int) -> socket.socket:
    """Take the listening socket before starting anything, so a busy port fails fast and cleanly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0): asyncio turns Nagle off only on sockets that say they are TCP, and
    # accepted connections inherit it; with proto 0 every keep-alive response stalled 40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise GatewayError(f"port {port} on {host} is already in use: pass --port with a free port") from exc
        raise GatewayError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock
