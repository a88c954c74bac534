"""Seeded streams for the calibration, coverage and label-shift alarms, and what the alarms decided on them.

Each alarm is folded over streams with calibrated stretches, shifts that raise the alarm and returns that clear it:
a single stream in irregular chunks (the service's way) and a batch of streams (the simulations' way). The outputs
are the labels (or predictions) at which each stream raised and cleared, and the statistics at the end of every
chunk. ``python tests/calibkit/recorded_alarms.py`` writes them to ``recorded/alarms.json.gz``; the file holds the
outputs of the alarms as they were before they shared ``calibkit.eprocess`` (each with its own step-by-step
recursion), and the test of ``calibkit.eprocess`` folds the same streams through the current code and compares
(``run``). Writing the file again would record the current code instead.
"""

from __future__ import annotations

import gzip
import importlib
import json
import sys
from pathlib import Path

import numpy as np

RECORDED = Path(__file__).parent / "recorded" / "alarms.json.gz"
LABELS = 3000
STREAMS = 4
DETECTOR = {"threshold": 300.0, "clear_threshold": 300.0, "min_clear_labels": 50}
COVERAGE = {"alpha": 0.1, "threshold": 200.0}
SHIFT = {
    "reference": (0.5, 0.3, 0.2),
    "n_reference": 2000,
    "tolerance": 0.03,
    "threshold": 1000.0,
    "clear_threshold": 1000.0,
    "min_clear": 20,
}


def _phases(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per label, whether it is in a shifted stretch: calibrated, shifted, calibrated, ... with random lengths."""
    shifted = np.zeros(n, bool)
    t, on = int(rng.integers(100, 600)), True
    while t < n:
        length = int(rng.integers(250, 700))
        shifted[t : t + length] = on
        t, on = t + length, not on
    return shifted


def chunks(seed: int, n: int, largest: int) -> list[int]:
    """Irregular chunk ends, from 1 to ``largest`` labels each."""
    rng = np.random.default_rng(seed)
    ends, t = [], 0
    while t < n:
        t = min(n, t + int(rng.integers(1, largest + 1)))
        ends.append(t)
    return ends


def detector_streams(seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct), (STREAMS, LABELS): accurate when calibrated, overconfident (accuracy
    sigmoid(logit(C) / s), s from 1.6 to 2.5) when shifted."""
    rng = np.random.default_rng(seed)
    confidence = 1.0 / (1.0 + np.exp(-rng.normal(2.0, 1.5, (STREAMS, LABELS))))
    confidence = np.maximum(confidence, 0.5)
    logit = np.log(confidence / (1 - confidence))
    accuracy = confidence.copy()
    for s in range(STREAMS):
        shifted = _phases(rng, LABELS)
        scale = 1.6 + 0.3 * s
        accuracy[s, shifted] = 1.0 / (1.0 + np.exp(-logit[s, shifted] / scale))
    correct = (rng.random((STREAMS, LABELS)) < accuracy).astype(np.float64)
    return confidence, correct


def coverage_streams(seed: int = 12) -> np.ndarray:
    """Miss indicators (STREAMS, LABELS): at rate alpha, and 2.5 alpha when shifted."""
    rng = np.random.default_rng(seed)
    rate = np.full((STREAMS, LABELS), COVERAGE["alpha"])
    for s in range(STREAMS):
        rate[s, _phases(rng, LABELS)] *= 2.5
    return (rng.random((STREAMS, LABELS)) < rate).astype(np.int64)


def shift_streams(seed: int = 13) -> np.ndarray:
    """Probability vectors (STREAMS, LABELS, 3): Dirichlet around the reference, around (0.3, 0.3, 0.4) when
    shifted."""
    rng = np.random.default_rng(seed)
    out = np.empty((STREAMS, LABELS, 3))
    for s in range(STREAMS):
        shifted = _phases(rng, LABELS)
        mean = np.where(shifted[:, None], [0.3, 0.3, 0.4], SHIFT["reference"])
        gamma = rng.gamma(4.0 * mean)
        out[s] = gamma / gamma.sum(axis=1, keepdims=True)
    return out


def _events(flags: np.ndarray) -> list[list[int]]:
    return [np.flatnonzero(row).tolist() for row in flags]


def _floats(values) -> list[float]:
    return [float(v) for v in np.ravel(values)]


def run_detector(module) -> dict:
    """The calibration detector on the single stream 0 in chunks and on the batch in chunks."""
    confidence, correct = detector_streams()
    config = module.DetectorConfig(**DETECTOR)
    out: dict = {}
    for name, rows, largest, seed in (("single", 1, 120, 21), ("batch", STREAMS, 60, 22)):
        state = module.DetectorState(config, rows)
        raised, cleared = np.zeros((rows, LABELS), bool), np.zeros((rows, LABELS), bool)
        statistic, clear, start = [], [], 0
        for end in chunks(seed, LABELS, largest):
            state, fold = _fold_detector(state, confidence[:rows, start:end], correct[:rows, start:end])
            raised[:, start:end], cleared[:, start:end] = fold.raised, fold.cleared
            statistic.append(_floats(state.statistic))
            clear.append(_floats(state.clear_statistic))
            start = end
        out[name] = {"raised": _events(raised), "cleared": _events(cleared), "statistic": statistic, "clear": clear}
        if rows == 1:
            out[name]["state"] = state.to_dict()
    return out


def _fold_detector(state, confidence, correct):
    """(state after, its ``Fold``), for a detector whose ``fold`` changes the state in place and returns the
    ``Fold`` as for one that returns a new state with ``trace``."""
    if hasattr(state, "trace"):
        return state.trace(confidence, correct)
    return state, state.fold(confidence, correct)


def run_coverage(module) -> dict:
    """The coverage alarm on the single stream 0 in chunks and on the batch in chunks."""
    errs = coverage_streams()
    config = module.CoverageAlarmConfig(**COVERAGE)
    out: dict = {}
    for name, rows, largest, seed in (("single", 1, 90, 31), ("batch", STREAMS, 70, 32)):
        state = module.CoverageAlarmState.fresh(config, rows)
        raised, statistic, start = [], [], 0
        for end in chunks(seed, LABELS, largest):
            state = state.fold(errs[0, start:end] if rows == 1 else errs[:, start:end])
            raised.append(state.raised_at.tolist())
            statistic.append(_floats(state.statistic))
            start = end
        out[name] = {"raised": raised, "statistic": statistic, "state": state.to_dict() if rows == 1 else None}
    return out


def run_shift(module) -> dict:
    """The label-shift alarm on the single stream 0 in chunks and on the batch in chunks."""
    probs = shift_streams()
    config = module.LabelShiftAlarmConfig(**SHIFT)
    out: dict = {}
    for name, rows, largest, seed in (("single", 1, 40, 41), ("batch", STREAMS, 15, 42)):
        state = module.LabelShiftAlarmState.fresh(config, rows)
        events, statistic, clear, start = [], [], [], 0
        for end in chunks(seed, LABELS, largest):
            state = state.fold(probs[0, start:end] if rows == 1 else probs[:, start:end])
            events.append([state.raised_at.tolist(), state.cleared_at.tolist(), state.raises.tolist()])
            statistic.append(_floats(state.statistic))
            clear.append(_floats(state.clear_statistic))
            start = end
        out[name] = {"events": events, "statistic": statistic, "clear": clear}
        if rows == 1:
            out[name]["state"] = state.to_dict()
    return out


def run(package: str = "calibkit") -> dict:
    """Every alarm's outputs, from the modules ``detector``, ``coverage_alarm`` and ``label_shift_alarm`` of
    ``package``."""
    load = importlib.import_module
    return {
        "recipe": {"labels": LABELS, "streams": STREAMS, "detector": DETECTOR, "coverage": COVERAGE, "shift": SHIFT},
        "detector": run_detector(load(f"{package}.detector")),
        "coverage": run_coverage(load(f"{package}.coverage_alarm")),
        "shift": run_shift(load(f"{package}.label_shift_alarm")),
    }


def load() -> dict:
    """The recorded outputs."""
    with gzip.open(RECORDED, "rt") as f:
        return json.load(f)


if __name__ == "__main__":
    RECORDED.parent.mkdir(exist_ok=True)
    data = run(sys.argv[1] if len(sys.argv) > 1 else "calibkit")
    with gzip.open(RECORDED, "wt") as f:
        json.dump(data, f)
    print(RECORDED, RECORDED.stat().st_size, "bytes")
