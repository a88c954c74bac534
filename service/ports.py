"""Free TCP ports for servers started next: the pod's when the settings say 0, benchmarks' and tests'."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing holds now, drawn below the ephemeral range (so no outgoing connection takes
    it before the server binds it), never twice in a process; else one the system picks."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10_000, low) if low > 10_100 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port on {host}")


def _ephemeral_low() -> int:
    """The low end of Linux's ephemeral port range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
