"""The hardware a measurement ran on, recorded beside its figures by the loss study (``training.study``) and the
benchmarks (``bench.common.machine``): one reading of /proc/cpuinfo for both. Imports nothing heavy (no torch)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def hardware() -> dict:
    """The CPU model (``/proc/cpuinfo``'s model name, else ``platform.processor()``), its widest vector extension
    (``"AVX-512"``, ``"AVX2"`` or None: machines sold under one model name can differ in it, and several-fold in
    speed), the core count and the memory in GiB."""
    lines = CPUINFO.read_text().splitlines() if CPUINFO.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line for line in lines if line.startswith("flags")), "")
    return {
        "cpu": cpu or platform.processor(),
        "isa": "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else None),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
