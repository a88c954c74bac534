"""A GPU-like model on the CPU (issue 54's fake engine model): the committed light model's outputs, each call
stretched by a sleep to the time a batch of the heavy model took in a recorded GPU run.

The batch time is the least-squares line ``t(rows) = a + c * rows`` through the recorded run's (``RECORDED``,
decision 0027's) time per call at one row and at each batch formed (``2 * batch / raw_rows_per_s``, two sessions).
``time.sleep`` releases the GIL, as ``InferenceSession.run`` does on CUDA, so the CPU measured is the front-ends',
the batcher's and the IPC's, not the model's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "gpu" / "2026-11-26-h100-run4.json"
HEAVY = "cifar-resnet56"
SESSIONS = 2  # the recorded run's sessions per model


def fitted_batch_ms(path: Path = RECORDED) -> tuple[float, float]:
    """``(a, c)`` of ``t(rows) = a + c * rows`` milliseconds, fitted to the recorded run's heavy model."""
    run = json.loads(path.read_text())
    points = [(1.0, run["single_row"][HEAVY]["p50_ms"])]
    points += [
        (p["batch"], SESSIONS * p["batch"] / p["raw_rows_per_s"] * 1e3)
        for p in run["points"]
        if p["model"] == HEAVY and p.get("raw_rows_per_s") and p.get("batch")
    ]
    rows, ms = np.array(points).T
    a, c = np.linalg.lstsq(np.c_[np.ones_like(rows), rows], ms, rcond=None)[0]
    return float(a), float(c)


def install(spec: str) -> None:
    """Wrap ``ModelRuntime.run`` so a call on ``rows`` rows lasts at least ``a + c * rows`` ms (``spec``: ``"a,c"``)."""
    from service.serving.runtime import ModelRuntime

    a, c = (float(v) / 1e3 for v in spec.split(","))
    run = ModelRuntime.run

    def stretched(self: ModelRuntime, x: np.ndarray | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        out = run(self, x)
        rows = len(x) if isinstance(x, np.ndarray) else sum(len(part) for part in x)
        time.sleep(max(0.0, a + c * rows - (time.perf_counter() - started)))
        return out

    ModelRuntime.run = stretched  # type: ignore[method-assign]
