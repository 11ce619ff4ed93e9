"""Which network interface carries an address (Linux): what gloo and NCCL are told to open their sockets
on (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``) when ranks of one engine run on several nodes.

The kernel is asked with ``SIOCGIFADDR`` per interface (IPv4 only: gloo's interface lookup is IPv4 too).
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915


def ipv4_of(interface: str) -> str | None:
    """The IPv4 address of ``interface``, or None (no address, no such interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(address: str) -> str | None:
    """The interface of this machine that has ``address`` (an IPv4 literal), or None."""
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            if ipv4_of(name) == address:
                return name
    return None
