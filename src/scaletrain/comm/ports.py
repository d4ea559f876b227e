"""TCP ports for rendezvous and endpoints: is one free, pick a free one."""

from __future__ import annotations

import socket


def port_free(port: int, addr: str = "") -> bool:
    """True if ``port`` can be bound on ``addr`` ("" = every interface; port 0 asks for any free one)."""
    with socket.socket() as s:
        try:
            s.bind((addr, port))
            return True
        except OSError:
            return False


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]
