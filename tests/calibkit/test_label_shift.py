"""calibkit.label_shift: EM and BBSE find the class priors of unlabelled windows drawn under label shift, their
intervals hold them, and the prior-adapted probabilities are calibrated under the new priors."""

import numpy as np
import pytest

from calibkit import metrics
from calibkit.label_shift import adapt_probabilities, bbse_priors, confusion_counts, em_bootstrap, em_priors
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

K = 5


@pytest.fixture(scope="module")
def source():
    """A calibrated model by construction (labels drawn from softmax(z), z ~ N(0, 9 I)): its posteriors are the true
    ones under uniform source priors (the logits' law is symmetric in the classes)."""
    z, y = calibrated_logits(100_000, n_classes=K, logit_scale=3.0, seed=41)
    return softmax(z), y


def shifted(source, priors, n, rng):
    """A window under label shift: the class counts drawn from ``priors``, each row drawn from the source rows of
    its class, so p(x | y) is the source's."""
    probs, labels = source
    counts = rng.multinomial(n, priors)
    rows = np.concatenate([rng.choice(np.flatnonzero(labels == k), c) for k, c in enumerate(counts)])
    return probs[rows], labels[rows]


def test_adaptation_is_bayes_rule_under_the_new_priors():
    p = np.array([[0.5, 0.3, 0.2], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(adapt_probabilities(p, [1, 1, 1]), p)
    np.testing.assert_allclose(adapt_probabilities(p[:1], [2, 1, 0]), [[10 / 13, 3 / 13, 0.0]])
    # all the row's mass on a class of weight 0: no adapted posterior, the row comes back as it was
    np.testing.assert_allclose(adapt_probabilities(p, [2, 1, 0])[1], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(adapt_probabilities(np.array([0.8, 0.4]), [1, 3]), [[1 / 13, 12 / 13], [1 / 3, 2 / 3]])


def test_em_stays_put_on_source_priors_it_was_calibrated_against(source):
    """The mean of the probabilities is a fixed point: EM with those as source priors returns them at once."""
    probs = source[0][:3000]
    start = probs.mean(axis=0)
    result = em_priors(probs, start)
    np.testing.assert_allclose(result.priors, start, atol=1e-12)
    np.testing.assert_allclose(result.weights, 1.0, atol=1e-10)
    assert result.iterations == 1 and result.converged and result.lower is None and result.n == 3000


def test_em_recovers_dirichlet_priors_better_than_bbse(source):
    """50 windows of 2,000 rows, their priors drawn from Dirichlet(1, ..., 1): EM's mean L1 error is under 0.05 and
    under BBSE's (the ordering Alexandari et al. 2020 report for calibrated probabilities). Sampling alone moves a
    window's class frequencies from its priors by about sum_k sqrt(2 pi_k (1 - pi_k) / (pi n)) in L1 (a binomial's mean
    absolute deviation), of the same order, so most of the error is not EM's."""
    rng = np.random.default_rng(42)
    confusion = confusion_counts(source[0][:20_000], source[1][:20_000])
    em, bbse = [], []
    for _ in range(50):
        priors = rng.dirichlet(np.ones(K))
        probs, _ = shifted(source, priors, 2000, rng)
        em.append(np.abs(np.subtract(em_priors(probs, np.full(K, 1 / K)).priors, priors)).sum())
        bbse.append(np.abs(np.subtract(bbse_priors(probs, confusion).priors, priors)).sum())
    assert np.mean(em) < 0.05
    assert np.mean(em) < np.mean(bbse)


def test_adapted_probabilities_are_calibrated_under_the_shifted_priors(source):
    """20 windows of 2,000 rows from priors (0.5, 0.25, 0.13, 0.08, 0.04): adapted with each window's EM weights, the
    probabilities' classwise ECE (the shift moves class frequencies, which the top label's ECE averages away) and
    top-label ECE are within 0.005 of the oracle's (adapted with the true weights); unadapted, the classwise ECE is
    several times larger and the NLL higher."""
    rng = np.random.default_rng(44)
    priors = np.array([0.5, 0.25, 0.13, 0.08, 0.04])
    kept, em, oracle, labels = [], [], [], []
    for _ in range(20):
        probs, y = shifted(source, priors, 2000, rng)
        kept.append(probs)
        em.append(adapt_probabilities(probs, em_priors(probs, np.full(K, 1 / K)).weights))
        oracle.append(adapt_probabilities(probs, priors * K))
        labels.append(y)
    kept, em, oracle, y = map(np.concatenate, (kept, em, oracle, labels))
    assert metrics.classwise_ece(em, y) < metrics.classwise_ece(oracle, y) + 0.005
    assert metrics.ece(em, y) < metrics.ece(oracle, y) + 0.005
    assert metrics.classwise_ece(kept, y) > 5 * metrics.classwise_ece(em, y)
    assert metrics.nll(em, y) < metrics.nll(kept, y)


def test_em_bootstrap_intervals_hold_the_priors(source):
    """A percentile bootstrap over the window's rows (100 resamples) around EM on 40 windows of 500 rows: it holds
    each class's prior in most windows (percentile intervals of a bounded estimate run a little short of their level
    near 0); the same seed gives the same interval."""
    rng = np.random.default_rng(43)
    held = []
    for window in range(40):
        priors = rng.dirichlet(np.ones(K))
        probs, _ = shifted(source, priors, 500, rng)
        result = em_priors(probs, np.full(K, 1 / K), resamples=100, level=0.9, seed=window)
        held.extend(lo <= p <= hi for lo, p, hi in zip(result.lower, priors, result.upper))
        assert all(lo <= p <= hi for lo, p, hi in zip(result.lower, result.priors, result.upper))
    assert np.mean(held) >= 0.8
    assert em_priors(probs, np.full(K, 1 / K), resamples=20, seed=3) == em_priors(
        probs, np.full(K, 1 / K), resamples=20, seed=3
    )
    # the draws behind the interval, the same for the same seed
    draws = em_bootstrap(probs, np.full(K, 1 / K), 20, seed=3)
    result = em_priors(probs, np.full(K, 1 / K), resamples=20, level=0.9, seed=3)
    np.testing.assert_allclose(np.quantile(draws, [0.05, 0.95], axis=0), [result.lower, result.upper])
    np.testing.assert_allclose(draws.sum(axis=1), 1.0)


def test_bbse_solves_the_confusion_system_and_clips_negative_weights():
    confusion = np.array([[30, 10, 5], [10, 30, 5], [10, 10, 40]])
    joint = confusion / confusion.sum()
    probs = np.repeat(np.eye(3) * 0.7 + 0.1, [50, 30, 20], axis=0)
    w = np.linalg.solve(joint, [0.5, 0.3, 0.2])
    result = bbse_priors(probs, confusion)
    np.testing.assert_allclose(result.priors, w * joint.sum(axis=0), atol=1e-12)
    np.testing.assert_allclose(result.weights, w, atol=1e-12)
    # predictions of class 2 rarer than its confusions with the others can explain: its weight is clipped to 0
    clipped = bbse_priors(np.repeat(np.eye(3) * 0.7 + 0.1, [60, 38, 2], axis=0), confusion)
    raw = np.linalg.solve(joint, [0.6, 0.38, 0.02])
    assert raw[2] < 0 and clipped.priors[2] == 0.0 and sum(clipped.priors) == pytest.approx(1.0)
    kept = raw[:2] * joint.sum(axis=0)[:2]
    np.testing.assert_allclose(clipped.priors[:2], kept / kept.sum(), atol=1e-12)


def test_bbse_delta_method_interval_holds_its_level():
    """400 simulated pairs of a validation confusion matrix (3,000 rows) and a window (2,000 predictions) from fixed
    source and target laws: the 95% delta-method interval holds each class's target prior about 95% of the time (the
    binomial standard error of the pooled rate over 1,600 class-windows, correlated within a window, is under one
    point; the bar is 0.92)."""
    rng = np.random.default_rng(45)
    conditional = np.full((4, 4), 0.1) + np.eye(4) * 0.6  # P(y_hat = i | y = j)
    source_priors, target = np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.5, 0.3, 0.15, 0.05])
    joint, mu = conditional * source_priors, conditional @ target
    held = []
    for _ in range(400):
        confusion = rng.multinomial(3000, joint.ravel()).reshape(4, 4)
        probs = np.repeat(np.eye(4) * 0.6 + 0.1, rng.multinomial(2000, mu), axis=0)
        result = bbse_priors(probs, confusion)
        held.extend(lo <= p <= hi for lo, p, hi in zip(result.lower, target, result.upper))
    assert np.mean(held) >= 0.92


def test_confusion_counts_put_predictions_in_rows_and_labels_in_columns():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    np.testing.assert_array_equal(confusion_counts(probs, [0, 0, 1, 2]), [[1, 1, 0], [1, 0, 0], [0, 0, 1]])


PROBS = np.array([[0.7, 0.3], [0.4, 0.6]])


@pytest.mark.parametrize(
    "call, name, shown",
    [
        (lambda: adapt_probabilities(PROBS, [1.0]), "weights", "[1.0]"),
        (lambda: adapt_probabilities(PROBS, [0.0, 0.0]), "weights", "[0.0, 0.0]"),
        (lambda: adapt_probabilities(PROBS, [-1.0, 2.0]), "weights", "[-1.0, 2.0]"),
        (lambda: em_priors(PROBS, [0.5, 0.6]), "source_priors", "[0.5, 0.6]"),
        (lambda: em_priors(PROBS, [1.0, 0.0]), "source_priors", "[1.0, 0.0]"),
        (lambda: em_priors(PROBS, [0.5, 0.5], tolerance=0), "tolerance", "0"),
        (lambda: em_priors(PROBS, [0.5, 0.5], max_iterations=0), "max_iterations", "0"),
        (lambda: em_priors(PROBS, [0.5, 0.5], resamples=-1), "resamples", "-1"),
        (lambda: em_priors(PROBS, [0.5, 0.5], resamples=2.5), "resamples", "2.5"),
        (lambda: em_priors(PROBS, [0.5, 0.5], level=1.0), "level", "1.0"),
        (lambda: em_bootstrap(PROBS, [0.5, 0.5], 0), "resamples", "0"),
        (lambda: em_bootstrap(PROBS, [0.5, 0.5], 3, tolerance=-1.0), "tolerance", "-1.0"),
        (lambda: bbse_priors(PROBS, [[1, 1], [1, 1]]), "confusion", "[[1.0, 1.0], [1.0, 1.0]]"),
        (lambda: bbse_priors(PROBS, [[1, 0], [1, 0]]), "confusion", "[[1.0, 0.0], [1.0, 0.0]]"),
        (lambda: bbse_priors(PROBS, [[1.5, 0], [0, 1]]), "confusion", "[[1.5, 0.0], [0.0, 1.0]]"),
        (lambda: bbse_priors(PROBS, [[1, 0, 0], [0, 1, 0]]), "confusion", "[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]"),
        (lambda: bbse_priors(PROBS, np.eye(2), level=0), "level", "0"),
    ],
)
def test_each_refusal_names_the_parameter_and_the_value(call, name, shown):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert f"Expected `{name}` to " in message and f"but got {shown}" in message, message
