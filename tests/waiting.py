"""Bounded waits for what a test's servers do in the background: a failure names what never happened."""

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from bench.common import loopback

T = TypeVar("T")


def wait_for(check: Callable[[], T], within: float, what: str, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} took longer than {within} s"
        time.sleep(every)
    return result


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now; False while nothing listens there yet."""
    try:
        return loopback.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False
