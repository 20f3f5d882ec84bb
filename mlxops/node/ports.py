"""Which of a node's ring ports are taken (a leftover rank, another job, another program)."""

from __future__ import annotations

import socket


def busy_ports(ip: str, ports: list[int]) -> list[int]:
    """Ports on ``ip`` that a listener could not bind now.

    SO_REUSEADDR as the ring backend's own listener uses it: a port in TIME_WAIT after a
    finished job is free for the next, one with a live listener is not.
    """
    busy = []
    for port in ports:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError:
                busy.append(port)
    return busy
