"""What a report shows of the label-shift alarm (``calibkit.label_shift_alarm``): beyond the statistic M_t and the
clearing evidence with their thresholds, the side whose detectors drive the statistic and, per class, the
reference, its band, the mean since the latest raise or clear, the exponentially weighted recent mean and the
statistic of each side (the mean over its bets of S, itself an e-detector: Shin, Ramdas & Rinaldo 2023).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from scipy import special

from calibkit.validation import expected

if TYPE_CHECKING:
    from calibkit.label_shift_alarm import LabelShiftAlarmState

__all__ = ["side_mixtures", "summary"]


def side_mixtures(log_s: np.ndarray, classes: int, bets: int) -> np.ndarray:
    """log of the mean over bets of S, per side: (streams, 2K J) -> (streams, 2, K)."""
    grouped = log_s.reshape(log_s.shape[0], 2, classes, bets)
    return special.logsumexp(grouped, axis=3) - math.log(bets)


def summary(state: LabelShiftAlarmState) -> dict:
    """What a report shows of a single-stream state: the statistic and the clearing evidence with their
    thresholds, the side that drives the statistic, and per class the reference, its band, the mean since the
    latest raise or clear, the weighted recent mean and the statistic of each side.

    Raises:
        ValueError: When the state has more than one stream.
    """
    if state.streams != 1:
        raise ValueError(expected("streams", "1 (a summary is of a single stream)", state.streams))
    cfg = state.config
    sides = state.side_statistics[0]
    log_sides = np.where(cfg.live, side_mixtures(state.log_statistic, cfg.classes, len(cfg.fractions))[0], -np.inf)
    side, k = np.unravel_index(int(np.argmax(log_sides)), log_sides.shape)
    count = int(state.since[0])
    since = state.since_sum[0] / count if count else np.full(cfg.classes, np.nan)
    recent = state.recent_sum[0] / state.recent_weight if state.recent_weight else np.full(cfg.classes, np.nan)
    return {
        "predictions": state.predictions,
        "alarmed": bool(state.alarmed[0]),
        "statistic": float(state.statistic[0]),
        "threshold": cfg.threshold,
        "clear_statistic": float(state.clear_statistic[0]) if state.alarmed[0] else None,
        "clear_threshold": cfg.clear_threshold,
        "driver": {"class": int(k), "side": ("up", "down")[int(side)]},
        "since": count,
        "classes": [
            {
                "class": j,
                "reference": cfg.reference[j],
                "lower": float(cfg.lower[j]),
                "upper": float(cfg.upper[j]),
                "mean_since": None if not count else float(since[j]),
                "recent_mean": None if not state.recent_weight else float(recent[j]),
                "up": float(sides[0, j]) if cfg.live[0, j] else None,
                "down": float(sides[1, j]) if cfg.live[1, j] else None,
            }
            for j in range(cfg.classes)
        ],
    }
