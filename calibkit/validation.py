"""Input checks shared by every public function of calibkit.

Each check either returns clean float64/int64 arrays or raises ``ValueError`` whose
message names the argument and the problem: a metric never silently returns a wrong number.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

#: Largest allowed deviation of a probability row sum from 1 (float32 softmax is within ~1e-6).
PROB_SUM_ATOL = 1e-4


def check_labels(labels, n_samples: int, n_classes: int) -> np.ndarray:
    """Class labels (integers, booleans or whole floats) of ``n_samples`` predictions of ``n_classes`` classes, as
    an int64 vector (N,) with values in [0, K)."""
    try:
        y = np.asarray(labels)
    except ValueError as exc:
        raise ValueError(f"labels must be a 1-D array of class indices: {exc}") from None
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D (N,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        raise ValueError(f"labels has {y.shape[0]} entries but the predictions have {n_samples} rows")
    if y.dtype == bool:
        y = y.astype(np.int64)
    elif not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.floating):
            raise ValueError(f"labels must be integers, got dtype {y.dtype}")
        if not np.all(np.isfinite(y)):
            raise ValueError("labels contain NaN or infinite values")
        if not np.all(y == np.round(y)):
            raise ValueError("labels must be whole numbers (class indices)")
    y = y.astype(np.int64)
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"labels must be in [0, {n_classes}); {int(bad.sum())} are out of range "
            f"(first at index {first}: {int(y[first])})"
        )
    return y


def check_probs(probs) -> np.ndarray:
    """Check probabilities: finite, in [0, 1], rows summing to 1 within ``PROB_SUM_ATOL``.

    A 1-D input is a binary problem given as the positive-class probability p, and becomes the two columns
    [1 - p, p] (so the predicted class is 1 exactly when p > 0.5). Returns a float64 (N, K) matrix, clipped to
    [0, 1].
    """
    p = _as_float_array("probs", probs)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    elif p.ndim != 2:
        raise ValueError(f"probs must be (N, K) or (N,) for binary problems, got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError("probs is empty: at least one prediction is needed")
    if p.shape[1] < 2:
        raise ValueError(
            f"probs must have at least 2 columns, got {p.shape[1]}; "
            "pass binary problems as (N,) positive-class probabilities"
        )
    if not np.all(np.isfinite(p)):
        raise ValueError(f"probs contain {int((~np.isfinite(p)).sum())} NaN or infinite values")
    if p.min() < -PROB_SUM_ATOL or p.max() > 1.0 + PROB_SUM_ATOL:
        raise ValueError(f"probs must lie in [0, 1], got values in [{p.min():.6g}, {p.max():.6g}]")
    row_err = np.abs(p.sum(axis=1) - 1.0)
    if row_err.max() > PROB_SUM_ATOL:
        worst = int(np.argmax(row_err))
        raise ValueError(
            f"probs rows must sum to 1 (tolerance {PROB_SUM_ATOL}); {int((row_err > PROB_SUM_ATOL).sum())} "
            f"rows do not (row {worst} sums to {p[worst].sum():.6g})"
        )
    return np.clip(p, 0.0, 1.0)


def row_problems(probs: np.ndarray) -> list[str | None]:
    """Why each row of a float (N, K) matrix is not a probability vector, by the checks of :func:`check_probs`: per
    row the problem (non-finite values, values outside [0, 1], a sum other than 1), or None."""
    p = np.asarray(probs, dtype=np.float64)
    # an array: numpy's stubs type any reduction over an axis as possibly a scalar
    finite = cast(np.ndarray, np.isfinite(p).all(axis=1))
    safe = np.where(np.isfinite(p), p, 0.5)
    in_range = (safe.min(axis=1) >= -PROB_SUM_ATOL) & (safe.max(axis=1) <= 1.0 + PROB_SUM_ATOL)
    sums = safe.sum(axis=1)
    sums_to_one = np.abs(sums - 1.0) <= PROB_SUM_ATOL
    out: list[str | None] = [None] * len(p)
    for i in np.flatnonzero(~(finite & in_range & sums_to_one)):
        if not finite[i]:
            out[i] = "probs contain NaN or infinite values"
        elif not in_range[i]:
            out[i] = f"probs must lie in [0, 1], got values in [{p[i].min():.6g}, {p[i].max():.6g}]"
        else:
            out[i] = f"probs must sum to 1 (tolerance {PROB_SUM_ATOL}); this row sums to {sums[i]:.6g}"
    return out


def check_probs_labels(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (N, K) float64, labels (N,) int64), checked by :func:`check_probs` and :func:`check_labels`."""
    p = check_probs(probs)
    return p, check_labels(labels, p.shape[0], p.shape[1])


def check_logits(logits) -> np.ndarray:
    """Logits as float64: real, finite, non-empty, (N, K) with K >= 2 or (N,) for a single-logit binary model."""
    z = _as_float_array("logits", logits)
    if z.ndim not in (1, 2):
        raise ValueError(f"logits must be (N, K) or (N,) for binary problems, got shape {z.shape}")
    if z.shape[0] == 0:
        raise ValueError("logits is empty: at least one sample is needed")
    if z.ndim == 2 and z.shape[1] < 2:
        raise ValueError(f"logits must have at least 2 columns, got {z.shape[1]}; pass a single binary logit as (N,)")
    if not np.all(np.isfinite(z)):
        raise ValueError(f"logits contain {int((~np.isfinite(z)).sum())} NaN or infinite values")
    return z


def check_logits_labels(logits, labels) -> tuple[np.ndarray, np.ndarray]:
    """(logits float64, labels (N,) int64); a 1-D logit vector is a binary problem with classes {0, 1}."""
    z = check_logits(logits)
    n_classes = 2 if z.ndim == 1 else z.shape[1]
    return z, check_labels(labels, z.shape[0], n_classes)


def check_n_bins(n_bins: int) -> int:
    """A number of bins: an integer of at least 1 (not a bool), as an int."""
    if not is_int(n_bins) or n_bins < 1:
        raise ValueError(expected("n_bins", "a positive integer", n_bins))
    return int(n_bins)


def is_number(value) -> bool:
    """A real number and not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def is_int(value) -> bool:
    """An integer and not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_threshold(name: str, value) -> float:
    """A threshold: a finite number > 1, as a float."""
    if not is_number(value) or not (math.isfinite(value) and value > 1):
        raise ValueError(expected(name, "a finite number > 1", value))
    return float(value)


def check_unit(name: str, value) -> float:
    """A probability strictly between 0 and 1 (a number, not a bool), as a float."""
    if not is_number(value) or not 0 < value < 1:
        raise ValueError(expected(name, "in (0, 1)", value))
    return float(value)


def check_int(name: str, value, low: int) -> int:
    """An integer >= ``low``, as an int."""
    if not is_int(value) or value < low:
        raise ValueError(expected(name, f"an integer >= {low}", value))
    return int(value)


def expected(name: str, requirement: str, value: object) -> str:
    """The message of a failed parameter check, ``"Expected `name` to be <requirement>, but got <value>"`` (the
    style of torchmetrics' messages); a numpy scalar is shown as the Python number it holds.

    Examples:
        >>> expected("max_bet", "in (0, 1)", 1.5)
        'Expected `max_bet` to be in (0, 1), but got 1.5'
        >>> expected("n_bins", "a positive integer", np.int64(0))
        'Expected `n_bins` to be a positive integer, but got 0'
    """
    shown = value.item() if isinstance(value, np.generic) else value
    return f"Expected `{name}` to be {requirement}, but got {shown!r}"


def _as_float_array(name: str, values) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except ValueError as exc:
        raise ValueError(f"{name} must be a rectangular numeric array: {exc}") from None
    if arr.dtype != bool and not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real numbers, got complex values")
    return arr.astype(np.float64)
