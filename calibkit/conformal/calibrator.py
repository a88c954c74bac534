"""``SplitConformal``: a fitted split-conformal calibrator, its sorted calibration scores and their JSON form."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calibkit.conformal._checks import (
    _check_alpha,
    _check_floor,
    _check_method,
    _check_probs,
    _check_scores,
    _check_u,
    _floor_draws,
)
from calibkit.conformal.quantile import _classwise_thresholds, _rank, _sort_by_class
from calibkit.conformal.scores import conformity_scores
from calibkit.conformal.sets import _p_values, _rule_sets
from calibkit.conformal.weighted import label_shift_thresholds
from calibkit.validation import check_int, check_labels, expected


@dataclass(frozen=True, eq=False)
class SplitConformal:
    """A fitted split-conformal calibrator: the method, its parameters and the sorted calibration scores.

    ``fit`` computes the scores, which the other methods apply with the free functions of this package; ``to_dict``
    / ``from_dict`` carry them through JSON exactly.

    Attributes:
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        scores: The calibration scores (n,), ascending (within each class when classwise).
        n_classes: K.
        k_reg: RAPS's number of top ranks without penalty (0 otherwise).
        lam: RAPS's penalty per rank beyond ``k_reg`` (0 otherwise).
        randomized: Whether the calibration scores were randomized (a record: any pairing of randomized or
            non-randomized scores and sets keeps coverage >= 1 - alpha; randomized on both sides makes it exact).
        class_counts: None for marginal sets, or the number of scores of each class (K,) for Mondrian sets.
        floor: Whether ``sets`` and ``p_values`` are the floor sets' (``floor_scores``), never randomized. Scores of
            any other rule are at least the floor scores of the same rows, so floor sets at their quantile keep
            coverage >= 1 - alpha too, conservatively.

    Raises:
        ValueError: Naming the field when one is malformed (unsorted scores included).

    Examples:
        >>> probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
        >>> cal = SplitConformal.fit(probs, [0, 1, 1, 2], "lac")
        >>> cal.scores.round(2).tolist(), cal.quantile(0.4)
        ([0.3, 0.4, 0.65, 0.8], 0.65)
        >>> cal.sets(np.array([[0.5, 0.4, 0.1]]), alpha=0.4).tolist()
        [[True, True, False]]
        >>> SplitConformal.from_dict(cal.to_dict()).quantile(0.4)
        0.65
    """

    method: str
    scores: np.ndarray
    n_classes: int
    k_reg: int = 0
    lam: float = 0.0
    randomized: bool = False
    class_counts: np.ndarray | None = None
    floor: bool = False

    def __post_init__(self) -> None:
        method, k_reg, lam = _check_method(self.method, self.k_reg, self.lam)
        _check_floor(self.floor, None)
        n_classes = check_int("n_classes", self.n_classes, 2)
        scores = _check_scores(self.scores)
        if not isinstance(self.randomized, (bool, np.bool_)):
            raise ValueError(expected("randomized", "a bool", self.randomized))
        counts = None
        if self.class_counts is not None:
            counts = np.asarray(self.class_counts)
            if (
                counts.shape != (self.n_classes,)
                or not np.issubdtype(counts.dtype, np.integer)
                or counts.min() < 0
                or counts.sum() != len(scores)
            ):
                raise ValueError(
                    f"Expected `class_counts` to be {self.n_classes} non-negative integers summing to the "
                    f"{len(scores)} scores, but got {counts.tolist()}"
                )
            counts = counts.astype(np.int64)
            bounds = np.concatenate([[0], np.cumsum(counts)])
            unsorted = any(np.any(np.diff(scores[a:b]) < 0) for a, b in zip(bounds[:-1], bounds[1:]))
        else:
            unsorted = bool(np.any(np.diff(scores) < 0))
        if unsorted:
            raise ValueError("Expected `scores` to be sorted in increasing order (within each class), but they are not")
        scores = scores.copy()
        scores.setflags(write=False)
        if counts is not None:
            counts.setflags(write=False)
        for name, value in (
            ("method", method),
            ("k_reg", k_reg),
            ("lam", lam),
            ("n_classes", n_classes),
            ("randomized", bool(self.randomized)),
            ("scores", scores),
            ("class_counts", counts),
            ("floor", bool(self.floor)),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def fit(
        cls,
        probs,
        labels,
        method: str = "lac",
        *,
        k_reg: int = 0,
        lam: float = 0.0,
        u=None,
        classwise: bool = False,
        floor: bool = False,
    ) -> SplitConformal:
        """Fit on a calibration split, kept apart from the data the model (and any temperature) was fitted on: the
        ``conformity_scores`` of its labels, sorted (per class with ``classwise``, for Mondrian sets)."""
        p = _check_probs(probs)
        y = check_labels(labels, p.shape[0], p.shape[1])
        scores = conformity_scores(p, y, method, k_reg=k_reg, lam=lam, u=u, floor=floor)
        if classwise:
            sorted_scores, counts = _sort_by_class(scores, y, p.shape[1])
        else:
            sorted_scores, counts = np.sort(scores), None
        return cls(method, sorted_scores, p.shape[1], k_reg, lam, u is not None, counts, floor)

    @property
    def classwise(self) -> bool:
        """Whether the quantiles, sets and p-values are class-conditional (Mondrian)."""
        return self.class_counts is not None

    def quantile(self, alpha: float) -> float | np.ndarray:
        """The threshold q for miscoverage ``alpha`` in (0, 1): ``conformal_quantile`` of the scores, or the
        thresholds (K,) when classwise."""
        a = _check_alpha(alpha)
        if self.class_counts is not None:
            return _classwise_thresholds(self.scores, self.class_counts, a)
        k = _rank(len(self.scores), a)
        return math.inf if k > len(self.scores) else float(self.scores[k - 1])

    def sets(self, probs, alpha: float, *, u=None) -> np.ndarray:
        """Prediction sets (N, K) at miscoverage ``alpha``: ``prediction_sets`` at ``quantile(alpha)``, randomized
        by the draws ``u`` (N,) or a numpy random generator (APS and RAPS; None for floor sets)."""
        p = self._check_width(probs)
        return _rule_sets(p, self.quantile(alpha), self.method, self.k_reg, self.lam, u, self.floor)

    def label_shift_quantiles(self, weights, alpha: float) -> np.ndarray:
        """The thresholds q_y (K,) under label shift, for the ratios w_y = pi_t(y) / pi_s(y) (K,):
        ``label_shift_thresholds`` of these classwise scores (a marginal calibrator's scores have no labels)."""
        if self.class_counts is None:
            raise ValueError(
                expected("class_counts", "the count of each class (a classwise calibrator: weights need labels)", None)
            )
        return label_shift_thresholds(self.scores, self.class_counts, weights, alpha)

    def label_shift_sets(self, probs, weights, alpha: float, *, u=None) -> np.ndarray:
        """Prediction sets (N, K) under label shift: ``prediction_sets`` at ``label_shift_quantiles(weights, alpha)``,
        under this calibrator's rule (randomized with ``u``, or the floor sets), for the probabilities the scores
        were computed from (not adapted to the new priors)."""
        p = self._check_width(probs)
        return _rule_sets(
            p, self.label_shift_quantiles(weights, alpha), self.method, self.k_reg, self.lam, u, self.floor
        )

    def p_values(self, probs, *, u=None) -> np.ndarray:
        """Conformal p-values (N, K) with these scores, whose level sets are ``sets`` (the proof:
        ``sets._p_values_from_scores``); ``u`` as for ``sets``."""
        p = self._check_width(probs)
        floor = _check_floor(self.floor, u)
        draws = _floor_draws(p.shape[0], self.method) if floor else _check_u(u, p.shape[0], self.method)
        return _p_values(p, self.scores, self.class_counts, self.method, self.k_reg, self.lam, draws, floor)

    def to_dict(self) -> dict:
        """``{"method", "n_classes", "k_reg", "lambda", "randomized", "scores", "class_counts"}``, which
        ``from_dict`` restores exactly: the scores a list of floats (Python's JSON writes floats so that they read
        back bit for bit), and ``"floor": true`` for a floor calibrator (``from_dict`` reads its absence as false).
        """
        floor = {"floor": True} if self.floor else {}
        return floor | {
            "method": self.method,
            "n_classes": self.n_classes,
            "k_reg": self.k_reg,
            "lambda": self.lam,
            "randomized": self.randomized,
            "scores": self.scores.tolist(),
            "class_counts": None if self.class_counts is None else self.class_counts.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> SplitConformal:
        """Rebuild a calibrator from ``to_dict`` output; a ValueError names the field at fault."""
        fields = ("method", "n_classes", "k_reg", "lambda", "randomized", "scores", "class_counts")
        if not isinstance(data, dict) or not set(fields) <= data.keys():
            shown = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(expected("data", "an object with " + ", ".join(repr(f) for f in fields), shown))
        counts = data["class_counts"]
        return cls(
            method=data["method"],
            scores=np.asarray(data["scores"], dtype=np.float64),
            n_classes=data["n_classes"],
            k_reg=data["k_reg"],
            lam=data["lambda"],
            randomized=data["randomized"],
            class_counts=None if counts is None else np.asarray(counts, dtype=np.int64),
            floor=data.get("floor", False),
        )

    def _check_width(self, probs) -> np.ndarray:
        p = _check_probs(probs)
        if p.shape[1] != self.n_classes:
            raise ValueError(f"probs have {p.shape[1]} classes but the calibrator was fitted on {self.n_classes}")
        return p
