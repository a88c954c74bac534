"""Mergeable sufficient statistics for streaming calibration metrics.

A ``BinStats`` holds only sums: per top-label confidence bin the count, the sum of confidences
and the number correct; per class and bin the same for p_k against 1[y = k] (unless it is built
without classes); and the totals of per-sample NLL and Brier terms. Sums add, so statistics of
batches, time windows or service replicas merge by element-wise addition and every metric of the
merged statistics equals the metric computed on the concatenated data (up to float rounding). The
service's store fills one per window from its per-block bin sums (``add_bins``), without classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from calibkit import binning, metrics
from calibkit.validation import check_n_bins, check_probs_labels, expected, is_int

# The default of the top-label sums: None, which __post_init__ replaces with zeros (typed as an array, which
# they hold once the statistics exist)
_UNSET = cast(np.ndarray, None)
_ARRAYS = ("count", "confidence_sum", "correct_sum", "class_count", "class_prob_sum", "class_label_sum")


@dataclass(eq=False)
class BinStats:
    """Per-bin sums of a stream of (probabilities, label) pairs; see the module docstring.

    Attributes:
        n_classes: K, or None for statistics without class-wise sums.
        n_bins: The number M of equal-width bins.
        count: Per top-label bin, the predictions (M,).
        confidence_sum: Per top-label bin, the sum of confidences (M,).
        correct_sum: Per top-label bin, the number correct (M,).
        class_count: Per class and bin of p_k, the predictions (K, M); None without classes.
        class_prob_sum: Per class and bin, the sum of p_k (K, M); None without classes.
        class_label_sum: Per class and bin, the number of labels k (K, M); None without classes.
        nll_sum: The sum of per-sample NLL terms.
        brier_sum: The sum of per-sample Brier terms.

    Raises:
        ValueError: Naming the field when a count, shape or sum is invalid.

    Examples:
        >>> s = BinStats.empty(n_classes=2, n_bins=5)
        >>> _ = s.update(np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([0, 1]))
        >>> _ = s.update(np.array([[0.3, 0.7], [0.4, 0.6]]), np.array([1, 1]))
        >>> s.n, round(s.ece(), 6), round(s.accuracy(), 6)
        (4, 0.25, 0.75)
    """

    n_classes: int | None
    n_bins: int = 15
    count: np.ndarray = field(default=_UNSET, repr=False)
    confidence_sum: np.ndarray = field(default=_UNSET, repr=False)
    correct_sum: np.ndarray = field(default=_UNSET, repr=False)
    class_count: np.ndarray | None = field(default=None, repr=False)
    class_prob_sum: np.ndarray | None = field(default=None, repr=False)
    class_label_sum: np.ndarray | None = field(default=None, repr=False)
    nll_sum: float = 0.0
    brier_sum: float = 0.0

    def __post_init__(self) -> None:
        self.n_bins = check_n_bins(self.n_bins)
        if self.n_classes is not None:
            if not is_int(self.n_classes) or self.n_classes < 2:
                raise ValueError(expected("n_classes", "an integer >= 2 or None", self.n_classes))
            self.n_classes = int(self.n_classes)
        shapes: dict[str, tuple[int, ...]] = {
            "count": (self.n_bins,),
            "confidence_sum": (self.n_bins,),
            "correct_sum": (self.n_bins,),
        }
        if self.n_classes is not None:
            shapes |= {name: (self.n_classes, self.n_bins) for name in _ARRAYS[3:]}
        for name in _ARRAYS[3:]:
            if name not in shapes and getattr(self, name) is not None:
                raise ValueError(
                    f"Expected `{name}` to be None for statistics without classes, but got an array of shape "
                    f"{np.shape(getattr(self, name))}"
                )
        for name, shape in shapes.items():
            value = getattr(self, name)
            arr = np.zeros(shape) if value is None else np.array(value, dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(f"Expected `{name}` to have shape {shape}, but got {arr.shape}")
            setattr(self, name, _check_sums(name, arr))
        self.nll_sum, self.brier_sum = float(self.nll_sum), float(self.brier_sum)

    @classmethod
    def empty(cls, n_classes: int | None, n_bins: int = 15) -> BinStats:
        """Statistics of no data, of K = ``n_classes`` classes (None: top-label sums only, no class-wise ECE)."""
        return cls(n_classes=n_classes, n_bins=n_bins)

    @classmethod
    def from_arrays(cls, probs, labels, n_bins: int = 15) -> BinStats:
        """Statistics of one batch, with class-wise sums (the width K of ``probs`` sets ``n_classes``)."""
        width = 2 if np.ndim(probs) == 1 else np.shape(probs)[1]
        return cls.empty(width, n_bins).update(probs, labels)

    @property
    def n(self) -> int:
        """Number of labelled predictions accumulated."""
        return int(round(self.count.sum()))

    def update(self, probs, labels) -> BinStats:
        """Add a batch of probabilities (N, K) of width ``n_classes`` (any width without classes) or (N,), and labels,
        in place; returns these statistics."""
        p, y = check_probs_labels(probs, labels)
        if self.n_classes is not None and p.shape[1] != self.n_classes:
            raise ValueError(f"probs has {p.shape[1]} classes but these statistics are for {self.n_classes}")
        edges = binning.equal_width_edges(self.n_bins)
        confidence, predicted = metrics.top_label(p)
        top = binning.bin_sums(confidence, (predicted == y).astype(np.float64), edges)
        self.add_bins(
            np.arange(self.n_bins),
            top.count,
            top.confidence_sum,
            top.outcome_sum,
            metrics.nll(p, y) * len(y),
            metrics.brier(p, y) * len(y),
        )
        if self.n_classes is not None:
            per_class = binning.classwise_bin_sums(p, y, edges)
            self.class_count += per_class.count
            self.class_prob_sum += per_class.confidence_sum
            self.class_label_sum += per_class.outcome_sum
        return self

    def add_bins(
        self, bins, count, confidence_sum, correct_sum, nll_sum: float = 0.0, brier_sum: float = 0.0
    ) -> BinStats:
        """Add per-bin sums computed elsewhere (a store's bin totals) in place: entry i adds ``count[i]`` predictions,
        their ``confidence_sum[i]`` and ``correct_sum[i]``, to top-label bin ``bins[i]`` (1-D; an index may repeat);
        ``nll_sum`` and ``brier_sum`` are their total NLL and Brier terms. Returns these statistics.

        Examples:
            >>> s = BinStats.empty(None, n_bins=2).add_bins([1], [4], [3.6], [3])
            >>> s.n, round(s.ece(), 6)
            (4, 0.15)
        """
        bins = np.asarray(bins, dtype=np.int64)
        values = [np.asarray(v, dtype=np.float64) for v in (count, confidence_sum, correct_sum)]
        if any(v.shape != bins.shape for v in values) or bins.ndim != 1:
            shapes = ", ".join(str(v.shape) for v in (bins, *values))
            raise ValueError(
                f"Expected `bins`, `count`, `confidence_sum` and `correct_sum` to be 1-D of one length, but got "
                f"shapes {shapes}"
            )
        if len(bins) and (bins.min() < 0 or bins.max() >= self.n_bins):
            outside = int(bins.min()) if bins.min() < 0 else int(bins.max())
            raise ValueError(expected("bins", f"bin indexes in [0, {self.n_bins})", outside))
        for name, v in zip(_ARRAYS, values):
            _check_sums(name, v)
        for target, v in zip((self.count, self.confidence_sum, self.correct_sum), values):
            np.add.at(target, bins, v)
        self.nll_sum += float(nll_sum)
        self.brier_sum += float(brier_sum)
        return self

    def merge(self, other: BinStats) -> BinStats:
        """New statistics whose sums are the element-wise sums of both (of the same ``n_classes`` and ``n_bins``):
        every metric of the result equals the metric on both data together."""
        if (self.n_classes, self.n_bins) != (other.n_classes, other.n_bins):
            raise ValueError(
                f"cannot merge statistics of {self.n_classes} classes x {self.n_bins} bins with "
                f"{other.n_classes} classes x {other.n_bins} bins"
            )
        summed: dict[str, Any] = {
            name: None if getattr(self, name) is None else getattr(self, name) + getattr(other, name)
            for name in _ARRAYS
        }
        return BinStats(
            n_classes=self.n_classes,
            n_bins=self.n_bins,
            nll_sum=self.nll_sum + other.nll_sum,
            brier_sum=self.brier_sum + other.brier_sum,
            **summed,
        )

    __add__ = merge

    @property
    def sums(self) -> binning.BinSums:
        """The top-label bin sums (what every binned metric of ``calibkit.binning`` takes)."""
        return binning.BinSums(self.count, self.confidence_sum, self.correct_sum)

    def _require_data(self) -> None:
        if self.n == 0:
            raise ValueError("no labelled predictions accumulated yet")

    def ece(self) -> float:
        """Top-label ECE, as ``metrics.ece`` on the accumulated data."""
        return binning.calibration_error(self.sums, "l1")

    def mce(self) -> float:
        """Maximum calibration error, as ``metrics.mce``."""
        return binning.calibration_error(self.sums, "max")

    def debiased_ece(self) -> float:
        """Debiased l2 calibration error, as ``metrics.debiased_ece``."""
        return binning.debiased_l2_error(self.sums)

    def overconfidence_error(self) -> float:
        """Overconfidence error, as ``metrics.overconfidence_error``."""
        self._require_data()
        return binning.overconfidence(self.sums)

    def classwise_ece(self) -> float:
        """Classwise ECE, as ``metrics.classwise_ece``."""
        self._require_data()
        if self.n_classes is None:
            raise ValueError("these statistics were built without classes: no class-wise sums")
        # __post_init__ gives statistics with classes all three class-wise sums
        assert self.class_count is not None and self.class_prob_sum is not None and self.class_label_sum is not None
        return binning.classwise_error(binning.BinSums(self.class_count, self.class_prob_sum, self.class_label_sum))

    def reliability(self) -> binning.Reliability:
        """Per-bin edges, count, mean confidence and accuracy, as ``metrics.reliability_bins``."""
        return binning.reliability(self.sums, binning.equal_width_edges(self.n_bins))

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
        """The sums as JSON lists, with ``n_classes`` and ``n_bins``, which ``from_dict`` restores exactly."""
        out = {"n_classes": self.n_classes, "n_bins": self.n_bins, "nll_sum": self.nll_sum, "brier_sum": self.brier_sum}
        out.update({name: None if getattr(self, name) is None else getattr(self, name).tolist() for name in _ARRAYS})
        return out

    @classmethod
    def from_dict(cls, data: dict) -> BinStats:
        """Rebuild statistics from ``to_dict`` output; a ValueError names the field when ``data`` is malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"BinStats data must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("n_classes", "n_bins", "nll_sum", "brier_sum", *_ARRAYS) if k not in data]
        if missing:
            raise ValueError(f"BinStats data is missing fields: {', '.join(missing)}")
        return cls(**{k: data[k] for k in ("n_classes", "n_bins", "nll_sum", "brier_sum", *_ARRAYS)})


def _check_sums(name: str, values: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(values)) or values.min(initial=0.0) < 0:
        raise ValueError(
            f"Expected `{name}` to hold finite non-negative sums, but got values in "
            f"[{values.min(initial=0.0):g}, {values.max(initial=0.0):g}]"
        )
    return values
