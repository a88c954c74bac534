"""calibkit.estimated_accuracy: the exact Poisson-binomial law, and an interval that holds a calibrated model's
realized accuracy on unlabelled windows as often as it says, and under label shift an interval for the adapted
predictions that carries the error of EM's priors."""

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from calibkit.estimated_accuracy import (
    IntervalChecks,
    estimate_accuracy,
    estimate_adapted_accuracy,
    poisson_binomial_pmf,
)
from calibkit.label_shift import adapt_probabilities, em_priors
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax


def test_the_law_is_the_binomial_when_every_probability_is_equal():
    np.testing.assert_allclose(poisson_binomial_pmf(np.full(400, 0.37)), stats.binom.pmf(np.arange(401), 400, 0.37))


def test_the_law_matches_enumeration_of_every_outcome():
    p = np.random.default_rng(3).random(10)
    brute = np.zeros(11)
    for outcome in itertools.product((0, 1), repeat=10):
        b = np.array(outcome)
        brute[b.sum()] += np.prod(np.where(b == 1, p, 1 - p))
    np.testing.assert_allclose(poisson_binomial_pmf(p), brute, atol=1e-15)


def test_the_law_has_the_moments_of_a_sum_of_bernoullis_at_thousands_of_rows():
    p = np.random.default_rng(4).beta(5, 1, 5000)
    pmf = poisson_binomial_pmf(p)
    s = np.arange(len(pmf))
    assert pmf.min() >= 0 and pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert (pmf * s).sum() == pytest.approx(p.sum(), rel=1e-12)
    assert (pmf * s**2).sum() - p.sum() ** 2 == pytest.approx((p * (1 - p)).sum(), rel=1e-9)
    np.testing.assert_array_equal(poisson_binomial_pmf([1.0, 1.0, 0.0]), [0.0, 0.0, 1.0, 0.0])


def test_the_estimate_is_the_mean_confidence_with_the_expected_count_of_each_class():
    probs = softmax(np.random.default_rng(5).normal(0, 2, (300, 4)))
    result = estimate_accuracy(probs, level=0.9)
    assert result.estimate == pytest.approx(probs.max(axis=1).mean())
    assert result.n == 300 and result.level == 0.9
    np.testing.assert_allclose(result.expected_counts, probs.sum(axis=0))
    assert sum(result.expected_counts) == pytest.approx(300)
    assert result.lower <= result.estimate <= result.upper
    wider = estimate_accuracy(probs, level=0.99)
    assert wider.lower <= result.lower and wider.upper >= result.upper
    assert result.to_dict()["expected_counts"] == list(result.expected_counts)


def test_binary_probabilities_may_be_one_column():
    p = np.array([0.9, 0.2, 0.6])
    result = estimate_accuracy(p)
    assert result.estimate == pytest.approx((0.9 + 0.8 + 0.6) / 3)
    np.testing.assert_allclose(result.expected_counts, [1.3, 1.7])


def test_the_interval_holds_the_realized_accuracy_of_calibrated_windows():
    """200 windows of 500 predictions of a model calibrated by construction (labels drawn from softmax(z)): the
    95% interval holds the realized accuracy at least 95% of the time (more, the law being discrete). Over 200
    windows the observed rate has a binomial standard error of sqrt(0.95 x 0.05 / 200) = 1.5 points, so the bar of
    93% sits 1.3 standard errors below the nominal rate; the run is seeded, so it passes or fails the same way."""
    z, y = calibrated_logits(200 * 500, n_classes=10, logit_scale=2.0, seed=31)
    probs = softmax(z).reshape(200, 500, 10)
    correct = (probs.argmax(axis=2) == y.reshape(200, 500)).mean(axis=1)
    held = [r.lower <= c <= r.upper for r, c in zip(map(estimate_accuracy, probs), correct)]
    assert np.mean(held) >= 0.93
    # and an over-confident model's interval (softmax(2 z)) misses most windows: it is no guarantee without calibration
    over = [estimate_accuracy(softmax(2.0 * w)) for w in z.reshape(200, 500, 10)[:40]]
    assert np.mean([r.lower <= c <= r.upper for r, c in zip(over, correct[:40])]) < 0.5


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5, -0.1, True, "0.9"])
def test_a_level_outside_the_unit_interval_is_refused(level):
    with pytest.raises(ValueError, match=f"Expected `level` to be in \\(0, 1\\), but got {level!r}"):
        estimate_accuracy(np.array([[0.6, 0.4]]), level=level)


@pytest.mark.parametrize(
    "values, shown", [([], "shape (0,)"), ([[0.5]], "shape (1, 1)"), ([0.2, 1.5], "1.5"), ([0.2, np.nan], "nan")]
)
def test_bad_probabilities_are_refused_by_name(values, shown):
    with pytest.raises(ValueError) as error:
        poisson_binomial_pmf(values)
    message = str(error.value)
    assert message.startswith("Expected `probabilities` to be a non-empty 1-D array") and shown in message, message


def test_interval_checks_fold_in_any_chunks_to_the_same_state_and_round_trip_json():
    rng = np.random.default_rng(3)
    confidence = rng.uniform(0.3, 1.0, 1234)
    correct = rng.random(1234) < confidence
    whole = IntervalChecks.fresh(100, 0.9).fold(confidence, correct)
    pieces = IntervalChecks.fresh(100, 0.9)
    for chunk in np.array_split(np.arange(1234), [1, 99, 100, 450, 451, 1200]):
        pieces = pieces.fold(confidence[chunk], correct[chunk])
    assert pieces == whole and (whole.windows, len(whole.pending)) == (12, 34)
    assert IntervalChecks.from_dict(json.loads(json.dumps(whole.to_dict())), 100, 0.9) == whole
    assert IntervalChecks.from_dict(whole.to_dict(), 200, 0.9) == IntervalChecks.fresh(200, 0.9)  # other settings
    with pytest.raises(ValueError, match="correct"):
        whole.fold([0.5, 0.6], [1])


def test_interval_checks_hold_at_least_their_level_on_calibrated_outcomes():
    """400 blocks of 200 calibrated outcomes: the share of blocks whose interval held is at least the level, up to
    its binomial sampling error (one-sided 99.9% bound)."""
    rng = np.random.default_rng(11)
    confidence = rng.beta(5, 1.5, 400 * 200)
    correct = rng.random(len(confidence)) < confidence
    checks = IntervalChecks.fresh(200, 0.9).fold(confidence, correct)
    assert checks.windows == 400
    assert checks.held >= stats.binom.ppf(0.001, 400, 0.9), checks.held


def _label_shifted_windows(windows: int, n: int, alpha: float, seed: int):
    """Windows of a calibrated 5-class model (labels drawn from softmax(z), uniform source priors) under label shift:
    priors ~ Dirichlet(alpha), class counts ~ Multinomial(n, priors), rows drawn by class (p(x | y) kept)."""
    z, y = calibrated_logits(50_000, n_classes=5, logit_scale=3.0, seed=seed)
    probs, rng = softmax(z), np.random.default_rng(seed)
    by_class = [np.flatnonzero(y == k) for k in range(5)]
    for _ in range(windows):
        counts = rng.multinomial(n, rng.dirichlet(np.full(5, alpha)))
        rows = np.concatenate([rng.choice(by_class[k], c) for k, c in enumerate(counts) if c])
        yield probs[rows], y[rows]


def test_the_adapted_interval_carries_the_priors_error_and_holds_its_level():
    """120 windows of 1,000 under strong label shift (Dirichlet 0.1): the plain interval of the EM-adapted
    probabilities treats EM's priors as exact; the mixture over their bootstrap holds the adapted predictions'
    realized accuracy in at least the binomial 0.1% quantile of 120 windows at 95% (it fails this check with
    probability below 0.001 when its coverage is 95%), and is wider than the plain one on average."""
    source, held, widths = np.full(5, 0.2), [], []
    for probs, labels in _label_shifted_windows(120, 1_000, 0.1, seed=51):
        result = estimate_adapted_accuracy(probs, source, resamples=60, seed=0)
        adapted = adapt_probabilities(probs, em_priors(probs, source).weights)
        plain = estimate_accuracy(adapted)
        realized = float(np.mean(adapted.argmax(axis=1) == labels))
        assert result.estimate == pytest.approx(plain.estimate, abs=1e-12)
        np.testing.assert_allclose(result.expected_counts, plain.expected_counts)
        held.append(result.lower <= realized <= result.upper)
        widths.append((result.upper - result.lower) - (plain.upper - plain.lower))
    assert sum(held) >= stats.binom.ppf(0.001, 120, 0.95)
    assert np.mean(widths) > 0


def test_the_normal_mixture_is_within_a_count_of_the_exact_mixture():
    """The normal approximation (continuity-corrected) of each resample's Poisson-binomial law moves the interval's
    ends by at most one count of n against the mixture of exact laws, on windows of 300 and levels 0.8 to 0.99."""
    for probs, _ in _label_shifted_windows(6, 300, 1.0, seed=52):
        for level in (0.8, 0.95, 0.99):
            approx = estimate_adapted_accuracy(probs, np.full(5, 0.2), level, resamples=30, seed=1)
            exact = estimate_adapted_accuracy(probs, np.full(5, 0.2), level, resamples=30, seed=1, exact=True)
            assert abs(approx.lower - exact.lower) <= 1 / 300 + 1e-12
            assert abs(approx.upper - exact.upper) <= 1 / 300 + 1e-12


def test_the_adapted_estimate_refuses_bad_arguments_by_name():
    probs = np.array([[0.7, 0.3], [0.4, 0.6]])
    for call, name in (
        (lambda: estimate_adapted_accuracy(probs, [0.5, 0.5], resamples=0), "resamples"),
        (lambda: estimate_adapted_accuracy(probs, [0.5, 0.6]), "source_priors"),
        (lambda: estimate_adapted_accuracy(probs, [0.5, 0.5], level=1.0), "level"),
    ):
        with pytest.raises(ValueError, match=f"Expected `{name}` to "):
            call()
