"""Label shift found and corrected without labels: new class priors from calibrated probabilities alone.

Under label shift the class priors move, pi_t(y) != pi_s(y), while p(x | y) stays: the source (validation) posterior
p(y | x) then becomes p_t(y | x) = w_y p(y | x) / sum_k w_k p(k | x), with w = pi_t / pi_s (Saerens, Latinne &
Decaestecker 2002). Two estimators of pi_t from a window of unlabelled predictions:

- ``em_priors``: the EM of Saerens et al. 2002 on calibrated probabilities, the maximum-likelihood estimate of the
  priors; Alexandari, Kundaje & Shrikumar 2020 show it beats BBSE and RLLS once the probabilities are calibrated with
  class biases (BCTS, ``calibkit.calibrators``). Its interval is a percentile bootstrap over the window's rows.
- ``bbse_priors``: black-box shift estimation (Lipton, Wang & Smola 2018), w = C^-1 mu_hat from the validation
  confusion matrix of hard predictions and the window's predicted-class frequencies, with a delta-method interval.

``em_bootstrap`` gives EM's bootstrap draws themselves; ``adapt_probabilities`` applies the estimated weights;
``confusion_counts`` builds the matrix BBSE needs, which the manifest carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from calibkit.validation import check_int, check_probs, check_probs_labels, check_unit, expected, is_number

#: EM's default stopping rule: every prior moves by at most this much in one iteration (Alexandari et al.'s code).
EM_TOLERANCE = 1e-6
#: EM's default bound on iterations.
EM_MAX_ITERATIONS = 1000
#: How far from 1 the source priors may sum.
PRIORS_ATOL = 1e-6


@dataclass(frozen=True)
class PriorEstimate:
    """Estimated target class priors and the weights w = priors / source priors that adapt probabilities to them.

    ``lower`` and ``upper`` bound each prior at ``level`` (None without an interval); ``n`` is the number of rows the
    estimate used; ``iterations`` and ``converged`` describe EM's run (0 and True for BBSE).
    """

    method: str
    priors: tuple[float, ...]
    weights: tuple[float, ...]
    lower: tuple[float, ...] | None
    upper: tuple[float, ...] | None
    level: float | None
    n: int
    iterations: int
    converged: bool

    def to_dict(self) -> dict:
        """The fields as plain JSON-serialisable data."""
        return {
            "method": self.method,
            "priors": list(self.priors),
            "weights": list(self.weights),
            "lower": None if self.lower is None else list(self.lower),
            "upper": None if self.upper is None else list(self.upper),
            "level": self.level,
            "n": self.n,
            "iterations": self.iterations,
            "converged": self.converged,
        }


def adapt_probabilities(probs, weights) -> np.ndarray:
    """Posteriors adapted to new class priors: p'(y | x) = w_y p(y | x) / sum_k w_k p(k | x).

    With w = pi_t / pi_s this is Bayes' rule under label shift (Saerens et al. 2002): p(x | y) is kept and
    only the priors change. A row whose mass lies only on classes of weight 0 has no adapted posterior; it is returned
    as it was. ``weights`` are K non-negative, finite numbers, not all 0 (a binary model's two).

    References:
        Saerens, Latinne & Decaestecker 2002, "Adjusting the Outputs of a Classifier to New a Priori Probabilities: A
        Simple Procedure", Neural Computation 14(1).

    Examples:
        >>> adapt_probabilities(np.array([[0.5, 0.5], [0.8, 0.2]]), [3.0, 1.0]).round(4).tolist()
        [[0.75, 0.25], [0.9231, 0.0769]]
    """
    p = check_probs(probs)
    w = _check_weights(weights, p.shape[1])
    unnormalised = p * w
    total = unnormalised.sum(axis=1, keepdims=True)
    return np.where(total > 0, unnormalised / np.where(total > 0, total, 1.0), p)


def em_priors(
    probs,
    source_priors,
    *,
    tolerance: float = EM_TOLERANCE,
    max_iterations: int = EM_MAX_ITERATIONS,
    resamples: int = 0,
    level: float = 0.95,
    seed: int | np.random.Generator | None = 0,
) -> PriorEstimate:
    """Target class priors by the EM of Saerens et al. 2002 on calibrated probabilities.

    From pi^0 = pi_s, each iteration adapts every row to the current priors, p^s(y | x_i) = w_y p(y | x_i) /
    sum_k w_k p(k | x_i) with w = pi^s / pi_s, and sets pi^{s+1} = (1/n) sum_i p^s(. | x_i); it stops at the first
    pi^{s+1} within ``tolerance`` of pi^s in every class (the rule of Alexandari et al.'s code) and returns it. The
    fixed point maximises the likelihood of the window under label shift. The probabilities must be calibrated on the
    source distribution (Alexandari et al. 2020: BCTS; plain temperature scaling can bias the estimate), and
    ``source_priors`` are the class frequencies they were calibrated against (the manifest's validation priors).

    With ``resamples`` > 0 each prior gets a percentile bootstrap interval at ``level``: the window's rows are
    resampled with replacement ``resamples`` times (seeded), EM is rerun on each resample, and the interval is the
    (1 - level) / 2 and (1 + level) / 2 quantiles of the estimates (Efron & Tibshirani 1993, Ch. 13).
    ``converged`` is False when ``max_iterations`` ran out.

    References:
        Saerens, Latinne & Decaestecker 2002, Neural Computation 14(1) (EM); Alexandari, Kundaje & Shrikumar
        2020, "Maximum Likelihood with Bias-Corrected Calibration is Hard-To-Beat at Label Shift Adaptation", ICML.

    Examples:
        >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.2, 0.8]])
        >>> r = em_priors(p, [0.5, 0.5])
        >>> [round(v, 3) for v in r.priors], r.converged
        ([0.911, 0.089], True)
    """
    p = check_probs(probs)
    n, k = p.shape
    source = _check_em(source_priors, k, tolerance, max_iterations)
    check_int("resamples", resamples, 0)
    check_unit("level", level)
    ratios = p / source
    priors, iterations, converged = _em(ratios, source[None, :], None, tolerance, max_iterations)
    lower = upper = None
    if resamples:
        boot = _bootstrap(ratios, source, resamples, seed, tolerance, max_iterations)
        lower, upper = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return _estimate("em", priors[0], source, lower, upper, level if resamples else None, n, iterations, converged)


def em_bootstrap(
    probs,
    source_priors,
    resamples: int,
    *,
    seed: int | np.random.Generator | None = 0,
    tolerance: float = EM_TOLERANCE,
    max_iterations: int = EM_MAX_ITERATIONS,
) -> np.ndarray:
    """EM's priors on ``resamples`` bootstrap resamples of the window's rows, (resamples, K): the draws behind
    ``em_priors``' interval (same seed, same draws), for propagating the priors' uncertainty through what depends on
    them (``calibkit.estimated_accuracy.estimate_adapted_accuracy``).

    Each resample draws the n rows with replacement and reruns EM on it from pi_s (Saerens et al. 2002; the
    percentile bootstrap of Efron & Tibshirani 1993, Ch. 13); all resamples run at once, as counts per row.

    Examples:
        >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.2, 0.8]])
        >>> draws = em_bootstrap(p, [0.5, 0.5], resamples=3)
        >>> draws.shape, bool(np.allclose(draws.sum(axis=1), 1.0))
        ((3, 2), True)
    """
    p = check_probs(probs)
    source = _check_em(source_priors, p.shape[1], tolerance, max_iterations)
    check_int("resamples", resamples, 1)
    return _bootstrap(p / source, source, resamples, seed, tolerance, max_iterations)


def _bootstrap(ratios, source, resamples, seed, tolerance, max_iterations) -> np.ndarray:
    """EM on ``resamples`` resamples of the rows of ``ratios`` (p / pi_s), as counts per row."""
    n, k = ratios.shape
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    counts = np.bincount(draws.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.float64)
    boot, _, _ = _em(ratios, np.broadcast_to(source, (resamples, k)), counts, tolerance, max_iterations)
    return boot


def _em(
    ratios: np.ndarray, start: np.ndarray, counts: np.ndarray | None, tolerance: float, max_iterations: int
) -> tuple[np.ndarray, int, bool]:
    """EM for B windows at once: row i counted counts[b, i] times in window b (all once when None).

    With r_iy = p(y | x_i) / pi_s(y), the adapted row is pi_y r_iy / sum_k pi_k r_ik, so one iteration is
    pi_new[b] = pi[b] * (sum_i c_bi r_i / (r_i . pi[b])) / n_b. Windows that have converged stop moving.
    """
    priors = start.copy()
    ratios_t = np.ascontiguousarray(ratios.T)
    weights = np.ones((1, ratios.shape[0])) if counts is None else counts
    active = np.ones(len(priors), dtype=bool)
    iterations = 0
    while active.any() and iterations < max_iterations:
        current = priors[active]
        rows = weights if counts is None else weights[active]
        denominators = current @ ratios_t  # (B_active, n): sum_k pi_k r_ik
        with np.errstate(divide="ignore", invalid="ignore"):
            shares = np.where(denominators > 0, rows / denominators, 0.0)
        updated = current * (shares @ ratios) / rows.sum(axis=1, keepdims=True)
        moved = np.abs(updated - current).max(axis=1)
        priors[active] = updated
        active[np.flatnonzero(active)[moved <= tolerance]] = False
        iterations += 1
    return priors, iterations, not active.any()


def confusion_counts(probs, labels) -> np.ndarray:
    """The joint confusion counts of hard predictions and labels: C[i, j] = #{rows predicted i whose label is j}.

    BBSE's matrix is C / n, an estimate of P_s(y_hat = i, y = j); its column sums / n are the source priors. From
    labelled source (validation) rows; a (K, K) int64 matrix, rows the predicted class, columns the label.

    Examples:
        >>> confusion_counts(np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]]), [0, 1, 1]).tolist()
        [[1, 1], [0, 1]]
    """
    p, y = check_probs_labels(probs, labels)
    k = p.shape[1]
    return np.bincount(p.argmax(axis=1) * k + y, minlength=k * k).reshape(k, k).astype(np.int64)


def bbse_priors(probs, confusion, level: float = 0.95) -> PriorEstimate:
    """Target class priors by black-box shift estimation (BBSE, Lipton, Wang & Smola 2018).

    With C[i, j] = P_s(y_hat = i, y = j) (``confusion`` / its total) and mu_hat[i] the share of the window predicted
    i, label shift gives mu = C w, so w = C^-1 mu_hat and pi_t = w * pi_s, pi_s the column sums of C. C^-1 mu_hat is
    unconstrained: negative weights are set to 0 and the priors w * pi_s renormalised to sum to 1, as the reference
    implementation labelshift does (abstention's clips without renormalising; without a clip both equal C^-1 mu_hat).

    The interval is the delta method's (van der Vaart 1998, Ch. 3) around the unclipped estimate, from the two
    independent multinomial samples: the window's n predictions (mu_hat) and the m validation rows behind C. With
    A = diag(pi_s) C^-1, Cov(pi_t) = A [(diag(mu) - mu mu^T) / n + diag(C w^2) / m] A^T - diag(pi_s w^2) / m, and
    pi_t +- z_{(1+level)/2} sd, clipped to [0, 1]. ``confusion`` holds the (K, K) counts of ``confusion_counts``
    for the same classifier on labelled validation rows, every label seen at least once, and must be invertible.

    References:
        Lipton, Wang & Smola 2018, "Detecting and Correcting for Label Shift with Black Box Predictors", ICML.

    Examples:
        >>> c = np.array([[40, 10], [10, 40]])
        >>> p = np.array([[0.8, 0.2]] * 7 + [[0.3, 0.7]] * 3)
        >>> [round(v, 3) for v in bbse_priors(p, c).priors]
        [0.833, 0.167]
    """
    p = check_probs(probs)
    n, k = p.shape
    counts = _check_confusion(confusion, k)
    check_unit("level", level)
    m = counts.sum()
    joint = counts / m
    source = joint.sum(axis=0)
    mu = np.bincount(p.argmax(axis=1), minlength=k) / n
    try:
        inverse = np.linalg.inv(joint)
    except np.linalg.LinAlgError:
        raise ValueError(expected("confusion", "an invertible matrix", counts.tolist())) from None
    w = inverse @ mu
    raw = w * source
    a = source[:, None] * inverse
    covariance = a @ ((np.diag(mu) - np.outer(mu, mu)) / n + np.diag(joint @ w**2) / m) @ a.T
    covariance -= np.diag(source * w**2) / m
    half = special.ndtri((1 + level) / 2) * np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    clipped = np.clip(w, 0.0, None) * source
    return _estimate(
        "bbse", clipped / clipped.sum(), source, np.clip(raw - half, 0, 1), np.clip(raw + half, 0, 1), level, n, 0, True
    )


def _estimate(method, priors, source, lower, upper, level, n, iterations, converged) -> PriorEstimate:
    def floats(values):
        return None if values is None else tuple(float(v) for v in values)

    return PriorEstimate(
        method=method,
        priors=floats(priors),
        weights=floats(priors / source),
        lower=floats(lower),
        upper=floats(upper),
        level=None if level is None else float(level),
        n=int(n),
        iterations=int(iterations),
        converged=bool(converged),
    )


def _check_weights(weights, k: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (k,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise ValueError(expected("weights", f"{k} non-negative finite numbers, not all 0", w.tolist()))
    return w


def _check_source_priors(values, k: int) -> np.ndarray:
    pi = np.asarray(values, dtype=np.float64)
    if pi.shape != (k,) or not np.all(np.isfinite(pi)) or np.any(pi <= 0) or abs(pi.sum() - 1.0) > PRIORS_ATOL:
        raise ValueError(expected("source_priors", f"{k} positive numbers summing to 1", pi.tolist()))
    return pi / pi.sum()


def _check_confusion(values, k: int) -> np.ndarray:
    c = np.asarray(values, dtype=np.float64)
    if (
        c.shape != (k, k)
        or not np.all(np.isfinite(c))
        or np.any(c < 0)
        or np.any(c != np.round(c))
        or np.any(c.sum(axis=0) == 0)
    ):
        raise ValueError(
            expected("confusion", f"a {k} x {k} matrix of counts with every column (label) seen", c.tolist())
        )
    return c


def _check_em(source_priors, k: int, tolerance, max_iterations) -> np.ndarray:
    """The source priors, checked with EM's stopping rule."""
    source = _check_source_priors(source_priors, k)
    if not is_number(tolerance) or not tolerance > 0:
        raise ValueError(expected("tolerance", "a positive number", tolerance))
    check_int("max_iterations", max_iterations, 1)
    return source
