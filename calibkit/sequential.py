"""An anytime-valid e-detector for miscalibration on a stream of labelled predictions.

For each labelled prediction the residual r_t = 1[correct] - confidence has mean 0 given the past
when the model is calibrated (E[1[correct] | confidence] = confidence). For a bet lambda in (-1, 1),
e_t = 1 + lambda r_t is then an e-value (E[e_t | past] = 1, e_t >= 0). The Shiryaev-Roberts
e-detector R_t = (R_{t-1} + 1) e_t (Shin, Ramdas & Rinaldo 2023, "E-detectors") makes R_t - t a
martingale under the null, so by Doob's maximal inequality P(max_{t <= n} R_t >= A) <= n / A:
with A = 10^6 the chance of any false alarm in 10,000 in-distribution labels is at most 1%, no
matter how often the statistic is looked at. The detector averages R over a grid of bets in both
directions (over- and under-confidence); an average of such detectors keeps the guarantee.

A deployed model is rarely perfectly calibrated; what matters is calibration worse than its
reference. With the reference's expected residual ``center`` c (accuracy - mean confidence on the
validation split) and a ``tolerance`` m, the null becomes |E[r_t | past] - c| <= m, and the bet
e_t = 1 + lambda (r_t - c) - |lambda| m has E[e_t | past] <= 1 under it, so R_t - t is a
supermartingale and the same bound n / A holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import special

DEFAULT_BETS = (0.05, 0.1, 0.2, 0.4, 0.7)


@dataclass
class ShiryaevRoberts:
    """Mixture Shiryaev-Roberts e-detector on residuals; see the module docstring.

    >>> d = ShiryaevRoberts()
    >>> _ = d.update(np.ones(300), np.full(300, 0.99))   # the confidences were right
    >>> d.statistic < 1e3
    True
    >>> _ = d.update(np.zeros(50), np.full(50, 0.99))    # 50 confident mistakes in a row
    >>> d.statistic > 1e6
    True
    """

    bets: tuple[float, ...] = DEFAULT_BETS
    center: float = 0.0
    tolerance: float = 0.0
    values: np.ndarray = field(default=None)
    n: int = 0

    def __post_init__(self) -> None:
        if any(not 0.0 < b < 1.0 for b in self.bets):
            raise ValueError(f"bets must lie in (0, 1), got {self.bets}")
        if self.tolerance < 0 or abs(self.center) + self.tolerance > 0.3:
            raise ValueError(f"need tolerance >= 0 and |center| + tolerance <= 0.3 (bets stay positive), "
                             f"got center {self.center}, tolerance {self.tolerance}")
        signed = np.array([*self.bets, *(-b for b in self.bets)])
        self._lambdas = signed
        self.values = np.zeros(len(signed)) if self.values is None else np.asarray(self.values, dtype=np.float64)
        if self.values.shape != signed.shape:
            raise ValueError(f"values must have {len(signed)} entries (one per signed bet)")

    @property
    def statistic(self) -> float:
        """R_t, the mean over bets of the per-bet Shiryaev-Roberts statistics."""
        return float(self.values.mean())

    def update(self, correct, confidence) -> float:
        """Fold in labelled predictions in arrival order; returns the new statistic."""
        correct = np.asarray(correct, dtype=np.float64).ravel()
        confidence = np.asarray(confidence, dtype=np.float64).ravel()
        if correct.shape != confidence.shape:
            raise ValueError("correct and confidence must have the same length")
        if np.any((confidence < 0) | (confidence > 1)) or not np.all(np.isfinite(confidence)):
            raise ValueError("confidence must lie in [0, 1]")
        if len(correct):
            # R_t = (R_{t-1} + 1) e_t unrolled: with L = cumsum(log e),
            # log R_t = L_t + log(R_0 + sum_{s=1..t} exp(-L_{s-1})), evaluated with logsumexp.
            slack = np.abs(self._lambdas) * self.tolerance
            e = 1.0 + np.outer(correct - confidence - self.center, self._lambdas) - slack
            log_e = np.log(e)
            cumulative = np.cumsum(log_e, axis=0)
            before = np.vstack([np.zeros((1, len(self._lambdas))), cumulative[:-1]])
            with np.errstate(divide="ignore"):
                log_start = np.log(self.values)
            log_sum = np.logaddexp(log_start, special.logsumexp(-before, axis=0))
            self.values = np.exp(np.minimum(cumulative[-1] + log_sum, 700.0))
        self.n += len(correct)
        return self.statistic

    def to_dict(self) -> dict:
        return {"bets": list(self.bets), "center": self.center, "tolerance": self.tolerance,
                "values": self.values.tolist(), "n": self.n}

    @classmethod
    def from_dict(cls, data: dict) -> "ShiryaevRoberts":
        return cls(bets=tuple(data["bets"]), center=float(data["center"]), tolerance=float(data["tolerance"]),
                   values=np.asarray(data["values"]), n=int(data["n"]))
