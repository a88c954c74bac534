"""The accuracy a calibrated model expects on unlabelled traffic, with an exact interval.

When the top-label confidence c_i = max_k p_ik is calibrated, P(prediction i is right | c_i) = c_i, so the number
right among n predictions is a sum of independent Bernoulli(c_i): it follows the Poisson-binomial law. Its mean
gives the average-confidence estimate of accuracy, sum_i c_i / n, unbiased and consistent; its quantiles give an
interval that holds the window's realized accuracy with at least the chosen probability, before any label arrives
(Kivimäki, Białek, Nurminen & Kuberski 2024). The expected count of each class, sum_i p_ik, comes from the same
probabilities.

Under label shift the probabilities are first adapted to EM's priors (``calibkit.label_shift``), and those priors are
themselves estimated from the window: ``estimate_adapted_accuracy`` carries their error into the interval by mixing
the Poisson-binomial laws of EM's bootstrap resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from calibkit.label_shift import adapt_probabilities, em_bootstrap, em_priors
from calibkit.validation import check_int, check_probs, check_unit, expected

#: EM's stopping rule on the bootstrap resamples of ``estimate_adapted_accuracy``: their spread, of order
#: 1 / sqrt(n), is far wider, so a looser rule than ``em_priors``' default changes nothing but the time.
BOOTSTRAP_TOLERANCE = 1e-4
#: The bootstrap resamples of ``estimate_adapted_accuracy`` by default.
ADAPTED_RESAMPLES = 100


@dataclass(frozen=True)
class EstimatedAccuracy:
    """The average-confidence estimate of a window's accuracy and its Poisson-binomial interval.

    ``estimate`` = sum_i c_i / n; [``lower``, ``upper``] holds the realized accuracy with probability at least
    ``level`` when the confidences are calibrated; ``expected_counts`` = (sum_i p_ik)_k, one per class.
    """

    estimate: float
    lower: float
    upper: float
    level: float
    n: int
    expected_counts: tuple[float, ...]

    def to_dict(self) -> dict:
        """The fields as plain JSON-serialisable data."""
        return {
            "estimate": self.estimate,
            "lower": self.lower,
            "upper": self.upper,
            "level": self.level,
            "n": self.n,
            "expected_counts": list(self.expected_counts),
        }


def poisson_binomial_pmf(probabilities) -> np.ndarray:
    """The law of S = sum_i B_i, the B_i independent Bernoulli(p_i): P(S = s) for s = 0..n.

    The recursion P_i(s) = P_{i-1}(s) (1 - p_i) + P_{i-1}(s - 1) p_i from P_0 = [1], run on blocks of 32 rows at
    once, then the blocks' laws convolved in pairs (``np.convolve``, direct): O(n^2) operations, O(32 + n / 32) of them
    in Python, all on non-negative terms, so exact to rounding (no cancellation, unlike the Fourier inversion of the
    characteristic function). ``probabilities`` are the p_i (n,), n >= 1, each in [0, 1].

    References:
        Hong 2013, "On computing the distribution function for the Poisson binomial distribution" (the recursion
        and the Fourier alternative); Kivimäki et al. 2024, arXiv 2407.08649 (its use for accuracy).

    Examples:
        >>> poisson_binomial_pmf([0.5, 0.5]).tolist()
        [0.25, 0.5, 0.25]
        >>> poisson_binomial_pmf([1.0, 0.2]).round(6).tolist()
        [0.0, 0.8, 0.2]
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0:
        raise ValueError(expected("probabilities", "a non-empty 1-D array of values in [0, 1]", _shown(p)))
    block = min(32, len(p))
    rows = np.pad(p, (0, -len(p) % block)).reshape(-1, block)  # p = 0 rows, whose law [1, 0, ...] changes nothing
    pmf = np.zeros((len(rows), block + 1))
    pmf[:, 0] = 1.0
    for i, pi in enumerate(rows.T[:, :, None], start=1):
        # P_i(s) for s = 1..i from P_{i-1}(s) and P_{i-1}(s - 1); the right-hand side is read before the write
        pmf[:, 1 : i + 1] = pmf[:, 1 : i + 1] * (1.0 - pi) + pmf[:, :i] * pi
        pmf[:, 0] *= 1.0 - pi[:, 0]
    laws = list(pmf)
    while len(laws) > 1:
        laws = [np.convolve(a, b) for a, b in zip(laws[::2], laws[1::2])] + laws[len(laws) - len(laws) % 2 :]
    return laws[0][: len(p) + 1]


def estimate_accuracy(probs, level: float = 0.95) -> EstimatedAccuracy:
    """The accuracy that calibrated probabilities promise on a window of n unlabelled predictions.

    estimate = (1/n) sum_i c_i with c_i = max_k p_ik, the average confidence: under top-label calibration the number
    right S is Poisson-binomial(c_1..c_n), so E[S / n] = estimate. The interval is equal-tailed on S:
    lower = F^-1((1 - level) / 2) / n and upper = F^-1((1 + level) / 2) / n with F^-1(q) = min{s : P(S <= s) >= q},
    so P(lower <= S / n <= upper) >= level (the law is discrete, hence at least). It covers this window's realized
    accuracy, given its confidences, assuming the outcomes are independent given them; it says nothing when the
    probabilities are not calibrated on this traffic (concept shift, or inputs unlike the validation split). The
    expected count of each class is sum_i p_ik.

    References:
        Kivimäki, Białek, Nurminen & Kuberski 2024, "Confidence-based Estimators for Predictive Performance in Model
        Monitoring", arXiv 2407.08649 (average confidence is unbiased and consistent; Poisson-binomial intervals).

    Examples:
        >>> r = estimate_accuracy(np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.3, 0.7]]), level=0.9)
        >>> round(r.estimate, 6), (r.lower, r.upper), [round(c, 6) for c in r.expected_counts]
        (0.725, (0.25, 1.0), [1.9, 2.1])
    """
    p = check_probs(probs)
    check_unit("level", level)
    confidence = p.max(axis=1)
    return _estimated(confidence.mean(), accuracy_interval(confidence, level), level, p)


def _estimated(estimate, interval: tuple[float, float], level: float, probs: np.ndarray) -> EstimatedAccuracy:
    """The estimate with its interval at ``level``, n and the expected count of each class of ``probs``."""
    counts = tuple(float(c) for c in probs.sum(axis=0))
    return EstimatedAccuracy(float(estimate), *interval, float(level), len(probs), counts)


def accuracy_interval(confidences, level: float = 0.95) -> tuple[float, float]:
    """The equal-tailed Poisson-binomial interval of ``estimate_accuracy`` from the top-label confidences alone.

    (F^-1((1 - level) / 2) / n, F^-1((1 + level) / 2) / n), F the law of S = sum_i B_i, B_i ~ Bernoulli(c_i)
    independent, F^-1(q) = min{s : P(S <= s) >= q} (Kivimäki et al. 2024).

    Examples:
        >>> accuracy_interval([0.9, 0.8, 0.6, 0.7], level=0.8)
        (0.5, 1.0)
    """
    check_unit("level", level)
    return _cdf_interval(np.cumsum(poisson_binomial_pmf(confidences)), level)


def _cdf_interval(cdf: np.ndarray, level: float) -> tuple[float, float]:
    """(F^-1((1 - level) / 2) / n, F^-1((1 + level) / 2) / n) of the CDF (n + 1,) of a count in 0..n."""
    n = len(cdf) - 1
    # the first s whose CDF reaches q; rounding can leave the last entry a hair under 1
    lower, upper = (min(int(np.searchsorted(cdf, q, side="left")), n) for q in ((1 - level) / 2, (1 + level) / 2))
    return lower / n, upper / n


def estimate_adapted_accuracy(
    probs,
    source_priors,
    level: float = 0.95,
    *,
    resamples: int = ADAPTED_RESAMPLES,
    seed: int | np.random.Generator | None = 0,
    exact: bool = False,
) -> EstimatedAccuracy:
    """The accuracy of the label-shift-adapted predictions on a window, with an interval that also carries the error
    of EM's priors.

    EM's priors pi on the window (``em_priors``, Saerens et al. 2002) adapt its probabilities, p' = adapt(p, pi /
    pi_s); the served predictions are y_i = argmax p'_i and the estimate is mean_i p'_i(y_i), as ``estimate_accuracy``
    (p') gives it. That function's interval treats p' as exact. Here, for each of R bootstrap resamples b of the
    window's rows (``em_bootstrap``), EM's priors pi^b adapt the window's own rows, p^b = adapt(p, pi^b / pi_s), and
    give the confidences of the same predictions, c^b_i = p^b_i(y_i). The number right is taken to follow the
    mixture (1/R) sum_b PoissonBinomial(c^b): a Poisson-binomial law (Kivimäki et al. 2024) whose probabilities are
    drawn from the priors' bootstrap law (Efron & Tibshirani 1993, Ch. 13), so its spread is the Bernoulli noise
    of the outcomes plus the priors' error. The interval is its equal-tailed quantiles / n.

    Each component is approximated by the normal law of its mean mu_b = sum_i c^b_i and variance sum_i c^b_i (1 -
    c^b_i), with a continuity correction, P(S <= s) ~ Phi((s + 1/2 - mu_b) / sigma_b): O(R n) rather than the
    recursion's O(R n^2), cheap enough for a service at n of a few thousand. ``exact`` mixes the exact laws
    (``poisson_binomial_pmf``) instead, to check the approximation. The expected counts are those of p'.

    References:
        Saerens, Latinne & Decaestecker 2002, Neural Computation 14(1); Kivimäki, Białek, Nurminen & Kuberski 2024,
        arXiv 2407.08649; Efron & Tibshirani 1993, "An Introduction to the Bootstrap", Ch. 13.

    Examples:
        >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]] * 25)
        >>> r = estimate_adapted_accuracy(p, [0.5, 0.5], level=0.9, resamples=50)
        >>> plain = estimate_accuracy(adapt_probabilities(p, em_priors(p, [0.5, 0.5]).weights), level=0.9)
        >>> r.estimate == plain.estimate, r.lower <= plain.lower, r.upper >= plain.upper
        (True, True, True)
    """
    p = check_probs(probs)
    check_unit("level", level)
    point = em_priors(p, source_priors)
    adapted = adapt_probabilities(p, point.weights)
    served = adapted.argmax(axis=1)
    source = np.asarray(source_priors, dtype=np.float64)  # checked by em_priors
    source = source / source.sum()
    draws = em_bootstrap(p, source_priors, resamples, seed=seed, tolerance=BOOTSTRAP_TOLERANCE)
    unnormalised = p[None, :, :] * (draws / source)[:, None, :]  # (R, n, K)
    total = unnormalised.sum(axis=2)
    rows = np.arange(len(p))
    confidences = np.where(total > 0, unnormalised[:, rows, served] / np.where(total > 0, total, 1.0), p[rows, served])
    return _estimated(adapted[rows, served].mean(), _mixture_interval(confidences, level, exact), level, adapted)


def _mixture_interval(confidences: np.ndarray, level: float, exact: bool) -> tuple[float, float]:
    """The equal-tailed interval / n of the mixture over rows b of PoissonBinomial(confidences[b]) (R, n): exact, or
    each component normal with a continuity correction."""
    n = confidences.shape[1]
    if exact:
        cdf = np.cumsum(np.mean([poisson_binomial_pmf(c) for c in confidences], axis=0))
    else:
        mu = confidences.sum(axis=1)
        sigma = np.sqrt((confidences * (1.0 - confidences)).sum(axis=1))
        s = np.arange(n + 1) + 0.5
        gap = s[None, :] - mu[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(sigma[:, None] > 0, gap / sigma[:, None], np.where(gap >= 0, np.inf, -np.inf))
        cdf = special.ndtr(z).mean(axis=0)
    return _cdf_interval(cdf, level)


def _shown(values: np.ndarray) -> object:
    """A short picture of a bad array for an error message: its shape, or its first offending value."""
    if values.ndim != 1 or len(values) == 0:
        return f"shape {values.shape}"
    bad = ~np.isfinite(values) | (values < 0.0) | (values > 1.0)
    return float(values[np.flatnonzero(bad)[0]]) if bad.any() else f"shape {values.shape}"


@dataclass(frozen=True)
class IntervalChecks:
    """How often ``accuracy_interval`` held, counted over consecutive blocks of ``block`` labelled predictions.

    Labels are folded in their order; each complete block of ``block`` (confidence, correct) pairs is one check: the
    interval of its confidences at ``level`` either holds its realized accuracy (``held``) or not. With calibrated
    confidences each check holds with probability at least ``level``, so ``held / windows`` estimates the interval's
    coverage on the served traffic. ``pending`` holds the rows of the incomplete block; folds in chunks agree.

    Examples:
        >>> checks = IntervalChecks.fresh(block=4, level=0.8).fold([0.9, 0.8, 0.6, 0.7, 0.9], [1, 1, 0, 1, 1])
        >>> checks.windows, checks.held, len(checks.pending)
        (1, 1, 1)
    """

    block: int
    level: float
    windows: int = 0
    held: int = 0
    pending: tuple[tuple[float, int], ...] = ()

    @classmethod
    def fresh(cls, block: int, level: float) -> IntervalChecks:
        """No check yet."""
        return cls(block=check_int("block", block, 1), level=check_unit("level", level))

    def fold(self, confidences, correct) -> IntervalChecks:
        """The state after the labelled rows (their served top-label confidence and whether it was right), in order."""
        c = np.asarray(confidences, dtype=np.float64).ravel()
        y = np.asarray(correct).ravel()
        if len(c) != len(y):
            raise ValueError(expected("correct", f"{len(c)} values, one per confidence", len(y)))
        rows = self.pending + tuple((float(ci), int(yi)) for ci, yi in zip(c, y, strict=True))
        windows, held = self.windows, self.held
        while len(rows) >= self.block:
            chunk, rows = rows[: self.block], rows[self.block :]
            lower, upper = accuracy_interval([ci for ci, _ in chunk], self.level)
            realized = sum(yi for _, yi in chunk) / self.block
            windows, held = windows + 1, held + int(lower <= realized <= upper)
        return IntervalChecks(self.block, self.level, windows, held, rows)

    def to_dict(self) -> dict:
        """The state as JSON data."""
        return {
            "block": self.block,
            "level": self.level,
            "windows": self.windows,
            "held": self.held,
            "pending": [list(row) for row in self.pending],
        }

    @classmethod
    def from_dict(cls, data: dict, block: int, level: float) -> IntervalChecks:
        """The state of ``to_dict``; a fresh one when it was saved with another block or level."""
        if data.get("block") != block or data.get("level") != float(level):
            return cls.fresh(block, level)
        pending = tuple((float(c), int(y)) for c, y in data["pending"])
        return cls(block, float(level), int(data["windows"]), int(data["held"]), pending)
