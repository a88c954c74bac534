"""Deterministic stratified train / validation / test index splits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.model_selection import train_test_split

DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3:
        raise ValueError(f"fractions must be (train, val, test); got {tuple(fractions)!r}")
    f_train, f_val, f_test = (float(f) for f in fractions)
    if f_train <= 0.0 or f_val < 0.0 or f_test < 0.0 or abs(f_train + f_val + f_test - 1.0) > 1e-6:
        raise ValueError(
            "fractions must be (train > 0, val >= 0, test >= 0) summing to 1; "
            f"got {(f_train, f_val, f_test)!r}"
        )
    return f_train, f_val, f_test


def _split_off(
    indices: np.ndarray, labels: np.ndarray | None, n_out: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if n_out == 0:
        return indices, indices[:0]
    strat = None if labels is None else labels[indices]
    try:
        keep, out = train_test_split(indices, test_size=n_out, random_state=seed, shuffle=True, stratify=strat)
    except ValueError as err:
        raise ValueError(
            f"cannot split {n_out} of {len(indices)} examples off with stratification "
            f"(every class needs at least 2 examples and every split at least one per class): {err}"
        ) from err
    return keep, out


def stratified_split(
    labels: np.ndarray | Sequence[int] | int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted int64 index arrays ``(train, val, test)`` of ``labels`` (stratified by class) or of an int's ``range(n)``
    (at random): scikit-learn's ``train_test_split`` (``random_state=seed``) splits off the test rows, then the
    validation rows from the rest, ``round(n * fraction)`` each."""
    f_train, f_val, f_test = _check_fractions(fractions)
    if isinstance(labels, (int, np.integer)):
        n, y = int(labels), None
        if n < 1:
            raise ValueError(f"need at least one example to split; got n={n}")
    else:
        y = np.asarray(labels)
        if y.ndim != 1 or y.size == 0:
            raise ValueError(f"labels must be a non-empty 1-D array; got shape {y.shape}")
        n = int(y.shape[0])
    n_test = int(round(n * f_test))
    n_val = int(round(n * f_val))
    if n - n_test - n_val < 1:
        raise ValueError(f"fractions {tuple(fractions)!r} leave no training examples out of {n}")
    everything = np.arange(n, dtype=np.int64)
    rest, test = _split_off(everything, y, n_test, seed)
    train, val = _split_off(rest, y, n_val, seed)
    return (
        np.sort(train).astype(np.int64),
        np.sort(val).astype(np.int64),
        np.sort(test).astype(np.int64),
    )


def split_off_fraction(labels: np.ndarray | Sequence[int], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted int64 index arrays ``(kept, split_off)``: ``round(n * fraction)`` rows split off, stratified by class, by
    one ``train_test_split`` with ``random_state=seed`` (``fraction`` 0 splits nothing off)."""
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array; got shape {y.shape}")
    if not 0.0 <= float(fraction) < 1.0:
        raise ValueError(f"Expected `fraction` to be in [0, 1), but got {fraction!r}")
    everything = np.arange(len(y), dtype=np.int64)
    kept, out = _split_off(everything, y, int(round(len(y) * float(fraction))), seed)
    return np.sort(kept).astype(np.int64), np.sort(out).astype(np.int64)
