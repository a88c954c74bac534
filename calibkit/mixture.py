"""The mixture both alarms watch: M_t = sum_j w_j S_t^(j) over e-processes S^(j) with weights summing to 1, itself an
e-process (Shin, Ramdas & Rinaldo, e-detectors; Vovk & Wang 2021 on averaging e-values). Arrays hold one stream per
row and one process per column, in logs.
"""

from __future__ import annotations

import numpy as np
from scipy import special


def log_mixture(log_s: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """log sum_j w_j S^(j) per stream, by ``scipy.special.logsumexp``."""
    return special.logsumexp(log_s + log_w, axis=1)


def crosses(log_s: np.ndarray, log_w: np.ndarray, level: float, among: np.ndarray) -> np.ndarray:
    """Per stream, ``among`` and log M >= ``level``. With weights summing to 1, M <= max_j S^(j), so only the rows
    whose largest log S^(j) reaches ``level`` are summed: on most labels of a calibrated stream, none is."""
    candidates = among & (log_s.max(axis=1) >= level)
    if not candidates.any():
        return candidates
    out = np.zeros_like(candidates)
    out[candidates] = log_mixture(log_s[candidates], log_w) >= level
    return out
