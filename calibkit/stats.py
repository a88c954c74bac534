"""Mergeable sufficient statistics for streaming calibration metrics.

A ``BinStats`` holds only sums: per top-label confidence bin the count, the sum of confidences
and the number correct; per class and bin the same for p_k against 1[y = k]; and the totals of
per-sample NLL and Brier terms. Sums add, so statistics of batches, time windows or service
replicas merge by element-wise addition and every metric of the merged statistics equals the
metric computed on the concatenated data (up to float rounding). This is what the service keeps
per window instead of raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from calibkit import binning, metrics
from calibkit.validation import check_n_bins, check_probs_labels

_ARRAYS = ("count", "confidence_sum", "correct_sum", "class_count", "class_prob_sum", "class_label_sum")


@dataclass(eq=False)
class BinStats:
    """Per-bin sums of a stream of (probabilities, label) pairs; see the module docstring.

    >>> s = BinStats.empty(n_classes=2, n_bins=5)
    >>> _ = s.update(np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([0, 1]))
    >>> _ = s.update(np.array([[0.3, 0.7], [0.4, 0.6]]), np.array([1, 1]))
    >>> s.n, round(s.ece(), 6), round(s.accuracy(), 6)
    (4, 0.25, 0.75)
    """

    n_classes: int
    n_bins: int = 15
    count: np.ndarray = field(default=None, repr=False)
    confidence_sum: np.ndarray = field(default=None, repr=False)
    correct_sum: np.ndarray = field(default=None, repr=False)
    class_count: np.ndarray = field(default=None, repr=False)
    class_prob_sum: np.ndarray = field(default=None, repr=False)
    class_label_sum: np.ndarray = field(default=None, repr=False)
    nll_sum: float = 0.0
    brier_sum: float = 0.0

    def __post_init__(self) -> None:
        self.n_bins = check_n_bins(self.n_bins)
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, (int, np.integer)) or self.n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2, got {self.n_classes!r}")
        self.n_classes = int(self.n_classes)
        shapes = {
            "count": (self.n_bins,),
            "confidence_sum": (self.n_bins,),
            "correct_sum": (self.n_bins,),
            "class_count": (self.n_classes, self.n_bins),
            "class_prob_sum": (self.n_classes, self.n_bins),
            "class_label_sum": (self.n_classes, self.n_bins),
        }
        for name, shape in shapes.items():
            value = getattr(self, name)
            arr = np.zeros(shape) if value is None else np.array(value, dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
            if not np.all(np.isfinite(arr)) or arr.min(initial=0.0) < 0:
                raise ValueError(f"{name} must hold finite non-negative sums")
            setattr(self, name, arr)
        self.nll_sum, self.brier_sum = float(self.nll_sum), float(self.brier_sum)

    @classmethod
    def empty(cls, n_classes: int, n_bins: int = 15) -> "BinStats":
        """Statistics of no data."""
        return cls(n_classes=n_classes, n_bins=n_bins)

    @classmethod
    def from_arrays(cls, probs, labels, n_bins: int = 15) -> "BinStats":
        """Statistics of one batch; K is taken from the width of ``probs``."""
        width = 2 if np.ndim(probs) == 1 else np.shape(probs)[1]
        return cls.empty(width, n_bins).update(probs, labels)

    @property
    def n(self) -> int:
        """Number of labelled predictions accumulated."""
        return int(round(self.count.sum()))

    def update(self, probs, labels) -> "BinStats":
        """Add a batch in place (and return self). Its width must equal ``n_classes``."""
        p, y = check_probs_labels(probs, labels)
        if p.shape[1] != self.n_classes:
            raise ValueError(f"probs has {p.shape[1]} classes but these statistics are for {self.n_classes}")
        edges = binning.equal_width_edges(self.n_bins)
        confidence, predicted = metrics.top_label(p)
        top = binning.bin_sums(confidence, (predicted == y).astype(np.float64), edges)
        per_class = binning.classwise_bin_sums(p, y, edges)
        self.count += top.count
        self.confidence_sum += top.confidence_sum
        self.correct_sum += top.outcome_sum
        self.class_count += per_class.count
        self.class_prob_sum += per_class.confidence_sum
        self.class_label_sum += per_class.outcome_sum
        self.nll_sum += metrics.nll(p, y) * len(y)
        self.brier_sum += metrics.brier(p, y) * len(y)
        return self

    def merge(self, other: "BinStats") -> "BinStats":
        """A new ``BinStats`` whose sums are the element-wise sums of both."""
        if (self.n_classes, self.n_bins) != (other.n_classes, other.n_bins):
            raise ValueError(
                f"cannot merge statistics of {self.n_classes} classes x {self.n_bins} bins with "
                f"{other.n_classes} classes x {other.n_bins} bins"
            )
        summed = {name: getattr(self, name) + getattr(other, name) for name in _ARRAYS}
        return BinStats(
            n_classes=self.n_classes,
            n_bins=self.n_bins,
            nll_sum=self.nll_sum + other.nll_sum,
            brier_sum=self.brier_sum + other.brier_sum,
            **summed,
        )

    __add__ = merge

    def _top(self) -> binning.BinSums:
        return binning.BinSums(self.count, self.confidence_sum, self.correct_sum)

    def _require_data(self) -> None:
        if self.n == 0:
            raise ValueError("no labelled predictions accumulated yet")

    def ece(self) -> float:
        """Top-label ECE, as ``metrics.ece`` on the accumulated data."""
        return binning.calibration_error(self._top(), "l1")

    def mce(self) -> float:
        """Maximum calibration error, as ``metrics.mce``."""
        return binning.calibration_error(self._top(), "max")

    def debiased_ece(self) -> float:
        """Debiased l2 calibration error, as ``metrics.debiased_ece``."""
        return binning.debiased_l2_error(self._top())

    def overconfidence_error(self) -> float:
        """Overconfidence error, as ``metrics.overconfidence_error``."""
        self._require_data()
        return binning.overconfidence(self._top())

    def classwise_ece(self) -> float:
        """Classwise ECE, as ``metrics.classwise_ece``."""
        self._require_data()
        return binning.classwise_error(binning.BinSums(self.class_count, self.class_prob_sum, self.class_label_sum))

    def reliability(self) -> binning.Reliability:
        """Per-bin edges, count, mean confidence and accuracy, as ``metrics.reliability_bins``."""
        return binning.reliability(self._top(), binning.equal_width_edges(self.n_bins))

    def accuracy(self) -> float:
        """Fraction correct."""
        self._require_data()
        return float(self.correct_sum.sum() / self.count.sum())

    def mean_confidence(self) -> float:
        """Mean top-label confidence (the accuracy a calibrated model expects)."""
        self._require_data()
        return float(self.confidence_sum.sum() / self.count.sum())

    def nll(self) -> float:
        """Mean negative log-likelihood, as ``metrics.nll``."""
        self._require_data()
        return self.nll_sum / self.count.sum()

    def brier(self) -> float:
        """Mean Brier score, as ``metrics.brier``."""
        self._require_data()
        return self.brier_sum / self.count.sum()

    def to_dict(self) -> dict:
        """JSON-serialisable form; ``from_dict`` restores it exactly."""
        out = {"n_classes": self.n_classes, "n_bins": self.n_bins, "nll_sum": self.nll_sum, "brier_sum": self.brier_sum}
        out.update({name: getattr(self, name).tolist() for name in _ARRAYS})
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "BinStats":
        """Inverse of ``to_dict``; malformed input raises ``ValueError`` naming the field."""
        if not isinstance(data, dict):
            raise ValueError(f"BinStats data must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("n_classes", "n_bins", "nll_sum", "brier_sum", *_ARRAYS) if k not in data]
        if missing:
            raise ValueError(f"BinStats data is missing fields: {', '.join(missing)}")
        return cls(**{k: data[k] for k in ("n_classes", "n_bins", "nll_sum", "brier_sum", *_ARRAYS)})
