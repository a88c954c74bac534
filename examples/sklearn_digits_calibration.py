"""Calibrate any scikit-learn classifier with calibkit: the embedded digits data, end to end.

A weakly regularised logistic regression is over-confident; temperature scaling fitted on a validation split fixes
that. Prints ECE, MCE, AdaECE, classwise ECE, NLL, Brier and accuracy on the test split, before and after, with 90%
bootstrap intervals.

    python examples/sklearn_digits_calibration.py
"""

from __future__ import annotations

from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from calibkit import metrics
from calibkit.bootstrap import confidence_interval
from calibkit.temperature import apply_temperature, fit_temperature

REPORTED = {
    "ECE": metrics.ece,
    "MCE": metrics.mce,
    "AdaECE": metrics.adaptive_ece,
    "CW-ECE": metrics.classwise_ece,
    "NLL": metrics.nll,
    "Brier": metrics.brier,
    "accuracy": metrics.accuracy,
}


def main() -> None:
    x, y = load_digits(return_X_y=True)
    x_train, x_rest, y_train, y_rest = train_test_split(x / 16.0, y, test_size=0.4, stratify=y, random_state=0)
    x_val, x_test, y_val, y_test = train_test_split(x_rest, y_rest, test_size=0.5, stratify=y_rest, random_state=0)

    model = LogisticRegression(C=1e4, max_iter=5000).fit(x_train, y_train)
    temperature = fit_temperature(model.decision_function(x_val), y_val)
    logits = model.decision_function(x_test)
    before, after = apply_temperature(logits, 1.0), apply_temperature(logits, temperature)

    print(f"digits: {len(y_train)} train / {len(y_val)} validation / {len(y_test)} test; fitted T = {temperature:.3f}")
    print(f"{'metric':<10}{'before':>28}{'after':>28}")
    for name, metric in REPORTED.items():
        cells = []
        for probs in (before, after):
            ci = confidence_interval(metric, probs, y_test, n_resamples=300, seed=0)
            cells.append(f"{ci.estimate:.4f} [{ci.low:.4f}, {ci.high:.4f}]")
        print(f"{name:<10}{cells[0]:>28}{cells[1]:>28}")


if __name__ == "__main__":
    main()
