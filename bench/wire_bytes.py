"""Bytes this process has sent over TCP, read from the kernel (Linux ``TCP_INFO``).

What a gloo group really puts on the wire: the payload of every TCP socket the process
holds, its collectives' framing included. A socket closed between two readings takes its
count with it, so read around work that keeps its connections (a process group does).
"""

from __future__ import annotations

import os
import socket
import struct

# struct tcp_info: tcpi_bytes_sent (Linux 4.19+) at byte 200, tcpi_bytes_acked (4.1+) at 120
_BYTES_SENT_OFFSET = 200
_BYTES_ACKED_OFFSET = 120
_TCP_INFO_LENGTH = 256


def _socket_bytes_sent(fd: int) -> int:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
    except OSError:  # not a TCP socket
        return 0
    finally:
        sock.close()
    if len(info) >= _BYTES_SENT_OFFSET + 8:
        return int(struct.unpack_from("Q", info, _BYTES_SENT_OFFSET)[0])
    if len(info) >= _BYTES_ACKED_OFFSET + 8:
        return int(struct.unpack_from("Q", info, _BYTES_ACKED_OFFSET)[0])
    return 0


def tcp_bytes_sent() -> int | None:
    """Bytes sent so far over this process's open TCP sockets; None off Linux."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    total = 0
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
        except OSError:
            continue
        total += _socket_bytes_sent(int(name))
    return total
