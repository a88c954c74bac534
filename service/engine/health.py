"""When an engine must end (``EngineFault``) for its supervisor to start a fresh one: a batch stuck past its model's
``deadline_seconds``, or a "sticky" CUDA error (``cudaError``) after which every call in the process fails."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

from service.serving.batching import DynamicBatcher

#: The ``cudaError_t`` codes that corrupt the context: ECCUncorrectable (214), IllegalAddress (700), LaunchTimeout
#: (702), Assert (710), HardwareStackError .. LaunchFailure (714-719).
STICKY_CUDA_ERRORS = frozenset({214, 700, 702, 710, 714, 715, 716, 717, 718, 719})
_CUDA_FAILURE = re.compile(r"CUDA failure (\d+)")
_STICKY_TEXT = re.compile(
    r"illegal memory access|unspecified launch failure|misaligned address|illegal instruction|"
    r"uncorrectable ECC error|hardware stack error|device-side assert",
    re.IGNORECASE,
)


class EngineFault(RuntimeError):
    """The engine cannot serve again in this process; its supervisor must start a new one."""


def sticky_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a device error that leaves the process's CUDA context unusable."""
    text = str(exc)
    code = _CUDA_FAILURE.search(text)
    return (code is not None and int(code[1]) in STICKY_CUDA_ERRORS) or _STICKY_TEXT.search(text) is not None


class Health:
    """The engine's state as its pings report it, and the reason it must end (``fault``), if any."""

    def __init__(self, scan_seconds: float = 0.1) -> None:
        self.fault: str | None = None
        self.scan_seconds = scan_seconds
        self._next_scan = 0.0

    def note(self, exc: BaseException, name: str) -> None:
        """Record a sticky device error of model ``name``'s batch as the engine's fault."""
        if self.fault is None and sticky_device_error(exc):
            self.fault = f"model {name}: a device error no later call recovers from: {exc}"

    def check(self, batchers: Mapping[tuple[str, str], DynamicBatcher]) -> str | None:
        """The fault, recorded or found now (a batch past its deadline; scanned at most every ``scan_seconds``)."""
        now = time.monotonic()
        if self.fault is None and now >= self._next_scan:
            self._next_scan = now + self.scan_seconds
            for batcher in batchers.values():
                stalled, deadline = batcher.stalled_seconds(), batcher.config.deadline_seconds
                if stalled > deadline:
                    self.fault = (
                        f"model {batcher.name}: a batch has run {stalled:.1f} s, past its {deadline:g} s deadline"
                    )
        return self.fault

    @staticmethod
    def progress(batchers: Iterable[DynamicBatcher]) -> tuple[int, float]:
        """Batches run in all, and how long the longest-running batch has run so far (what a ping reports)."""
        every = list(batchers)
        return sum(b.batches_run for b in every), max((b.stalled_seconds() for b in every), default=0.0)
