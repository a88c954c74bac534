"""Evaluation before and after calibration: the test split, every corruption x severity, and OOD.

All numbers come from calibkit (one home of the math). Intervals are 90% *basic* bootstrap intervals over test rows (2
theta - q_hi, 2 theta - q_lo), cut to the metric's range: binned ECE is biased upwards on finite samples and its
percentile interval can exclude the estimate; the basic interval corrects for that bias, and for mean-type metrics
(accuracy, NLL, Brier) it matches the percentile one. Shift follows Ovadia et al. 2019: calibration is measured on
corrupted copies of the test split (Hendrycks & Dietterich 2019 corruptions, severities 1..5).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from sklearn.metrics import roc_auc_score

from calibkit import metrics
from calibkit.bootstrap import confidence_intervals
from calibkit.calibrators import Calibrator
from calibkit.temperature import ECE_GRID, apply_temperature, softmax
from training.config import RunConfig
from training.data import DataSplits, corrupt, ood_dataset

LogitsFn = Callable[[np.ndarray], np.ndarray]


def reported_metrics(n_bins: int = 15) -> dict[str, Callable]:
    """The metrics every report shows, in order."""
    return {
        "accuracy": metrics.accuracy,
        "ece": partial(metrics.ece, n_bins=n_bins),
        "mce": partial(metrics.mce, n_bins=n_bins),
        "adaptive_ece": partial(metrics.adaptive_ece, n_bins=n_bins),
        "classwise_ece": partial(metrics.classwise_ece, n_bins=n_bins),
        "nll": metrics.nll,
        "brier": metrics.brier,
    }


def score(probs: np.ndarray, labels: np.ndarray, n_resamples: int, n_bins: int = 15, seed: int = 0) -> dict:
    """``{metric: {"value", "ci": [lo, hi]}}`` with 90% basic bootstrap intervals (see module docstring)."""
    cis = confidence_intervals(
        reported_metrics(n_bins), probs, labels, n_resamples=n_resamples, seed=seed, method="basic"
    )
    upper = {"nll": np.inf, "brier": 2.0}  # the others are probabilities or gaps between them, in [0, 1]
    return {
        name: {"value": ci.estimate, "ci": np.clip([ci.low, ci.high], 0.0, upper.get(name, 1.0)).tolist()}
        for name, ci in cis.items()
    }


def before_after(logits: np.ndarray, labels: np.ndarray, calibrator: Calibrator, n_resamples: int, n_bins: int) -> dict:
    """Scores of softmax(logits) and of the calibrated probabilities."""
    return {
        "before": score(softmax(logits), labels, n_resamples, n_bins),
        "after": score(calibrator.transform(logits), labels, n_resamples, n_bins),
    }


def predictive_entropy(probs: np.ndarray) -> np.ndarray:
    """H(p) = -sum_k p_k log p_k per row."""
    return -np.sum(probs * np.log(np.clip(probs, 1e-300, 1.0)), axis=1)


def ood_auroc(in_probs: np.ndarray, out_probs: np.ndarray) -> float:
    """AUROC of predictive entropy for telling OOD inputs (positive) from in-distribution ones."""
    truth = np.r_[np.zeros(len(in_probs)), np.ones(len(out_probs))]
    return float(roc_auc_score(truth, np.r_[predictive_entropy(in_probs), predictive_entropy(out_probs)]))


def ece_by_temperature(logits: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """ECE of softmax(logits / T) on Mukhoti et al.'s temperature grid (the ECE-vs-T curve)."""
    return {
        "temperature": ECE_GRID.tolist(),
        "ece": [metrics.ece(apply_temperature(logits, t), labels, n_bins) for t in ECE_GRID],
    }


def calibration_evaluation(
    calibrator: Calibrator, rows: dict[str, tuple[np.ndarray, np.ndarray]], n_resamples: tuple[int, int], n_bins: int
) -> dict:
    """Scores before/after ``calibrator`` and ECE-vs-T curves on ``rows``: validation then test (logits, labels)."""
    (val_logits, y_val), (test_logits, y_test) = rows.values()
    return {
        "calibration": calibrator.to_dict(),
        "validation": before_after(val_logits, y_val, calibrator, n_resamples[0], n_bins),
        "test": before_after(test_logits, y_test, calibrator, n_resamples[1], n_bins),
        "ece_vs_temperature": {name: ece_by_temperature(*part, n_bins) for name, part in rows.items()},
        "shifted": {},
    }


def evaluate(logits_fn: LogitsFn, calibrator: Calibrator, splits: DataSplits, config: RunConfig) -> dict:
    """The full evaluation written to ``metrics.json``."""
    test_logits, y_test = logits_fn(splits.test.x), splits.test.y
    rows = {"validation": (logits_fn(splits.val.x), splits.val.y), "test": (test_logits, y_test)}
    result = calibration_evaluation(calibrator, rows, (config.n_resamples_shifted, config.n_resamples), config.n_bins)
    for name in config.corruptions:
        result["shifted"][name] = {}
        for severity in config.severities:
            x = corrupt(splits.test.x, name, severity, seed=config.seed)
            result["shifted"][name][str(severity)] = before_after(
                logits_fn(x), y_test, calibrator, config.n_resamples_shifted, config.n_bins
            )
    ood_x = ood_dataset(config.ood, splits.test, n=len(y_test), seed=config.seed)
    ood_logits = logits_fn(ood_x)
    result["ood"] = {
        "kind": config.ood,
        "n_in": len(y_test),
        "n_out": len(ood_x),
        "auroc_before": ood_auroc(softmax(test_logits), softmax(ood_logits)),
        "auroc_after": ood_auroc(calibrator.transform(test_logits), calibrator.transform(ood_logits)),
    }
    return result
