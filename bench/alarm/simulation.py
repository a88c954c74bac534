"""Seeded simulation of the alarm on many streams at once: calibrated labels, then (optionally) a
miscalibration, then calibrated labels again; what the detector did in each phase of each stream.

    >>> from calibkit.synthetic import TrafficShape, Miscalibration
    >>> out = simulate(TrafficShape("cifar-like", 10, 2.5), Miscalibration("x2.5", logit_scale=2.5),
    ...                streams=20, before=500, during=1500, after=1500, seed=0)
    >>> bool(out.false_alarm.any()), bool((out.delay >= 0).all()), bool(out.latched.any())
    (False, True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from calibkit.detector import DetectorConfig, DetectorState
from calibkit.synthetic import Miscalibration, TrafficShape, draw

CHUNK_VALUES = 20_000_000  # e-values (streams x detectors x labels) folded per call: bounds the memory of a fold


@dataclass(frozen=True)
class StreamOutcomes:
    """Per stream: a false alarm, the delay to the first alarm (-1: none), flaps, whether the alarm was on at the
    shift's end, the delay from there to the first clear (-1: none), and whether it was on at the end (latched)."""

    false_alarm: np.ndarray
    delay: np.ndarray
    flaps: np.ndarray
    clear_delay: np.ndarray
    latched: np.ndarray
    alarmed_at_end: np.ndarray | None = None


def run_detector(
    confidence: np.ndarray, correct: np.ndarray, before: int, during: int = 0, config: DetectorConfig | None = None
) -> StreamOutcomes:
    """The detector on every stream (row) of ``draw``'s arrays, phases as there."""
    streams, total = confidence.shape
    state = DetectorState(config or DetectorConfig(), streams)
    chunk = max(state.config.block, CHUNK_VALUES // (streams * state.config.detectors))
    raised, cleared = np.zeros((streams, total), bool), np.zeros((streams, total), bool)
    after = before + during
    alarmed_at_end = np.zeros(streams, bool)
    start = 0
    while start < total:
        stop = min(start + chunk, total)
        stop = after if start < after < stop else stop
        state, fold = state.trace(confidence[:, start:stop], correct[:, start:stop])
        raised[:, start:stop], cleared[:, start:stop] = fold.raised, fold.cleared
        if stop == after:
            alarmed_at_end = state.alarmed.copy()
        start = stop
    return StreamOutcomes(
        # an array: numpy's stubs type any reduction over an axis as possibly a scalar
        false_alarm=cast(np.ndarray, raised[:, :before].any(axis=1)),
        delay=_first(raised[:, before:after]),
        flaps=cleared[:, before:after].sum(axis=1),
        clear_delay=_first(cleared[:, after:]),
        latched=state.alarmed.copy(),
        alarmed_at_end=alarmed_at_end,
    )


def _first(events: np.ndarray) -> np.ndarray:
    """Per row, the index of the first True (-1: none)."""
    return np.where(events.any(axis=1), events.argmax(axis=1), -1) if events.shape[1] else np.full(len(events), -1)


def simulate(
    shape: TrafficShape,
    miscalibration: Miscalibration | None,
    streams: int,
    before: int,
    during: int = 0,
    after: int = 0,
    config: DetectorConfig | None = None,
    seed: int = 0,
    ramp: int = 0,
) -> StreamOutcomes:
    """``draw`` then ``run_detector``."""
    confidence, correct = draw(shape, miscalibration, streams, before, during, after, seed, ramp)
    return run_detector(confidence, correct, before, during, config)
