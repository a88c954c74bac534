"""calibkit.metrics: hand-computed values, bin conventions, properties and bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from calibkit import metrics
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

# Four predictions: confidences .9 (right), .8 (wrong), .7 (right), .6 (right).
PROBS = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
LABELS = np.array([0, 1, 1, 1])

ALL_METRICS = [
    metrics.ece,
    metrics.mce,
    metrics.adaptive_ece,
    metrics.classwise_ece,
    metrics.debiased_ece,
    metrics.overconfidence_error,
    metrics.accuracy,
    metrics.nll,
    metrics.brier,
]


def test_ece_by_hand():
    # 5 bins: (.4,.6] holds .6 (acc 1); (.6,.8] holds .8, .7 (acc .5); (.8,1] holds .9 (acc 1).
    assert metrics.ece(PROBS, LABELS, n_bins=5) == pytest.approx((0.4 + 0.5 + 0.1) / 4, abs=1e-12)


def test_mce_by_hand():
    assert metrics.mce(PROBS, LABELS, n_bins=5) == pytest.approx(0.4, abs=1e-12)


def test_adaptive_ece_by_hand():
    # Two equal-mass bins: {.6 right, .7 right} and {.8 wrong, .9 right}.
    assert metrics.adaptive_ece(PROBS, LABELS, n_bins=2) == pytest.approx((abs(2 - 1.3) + abs(1 - 1.7)) / 4)


def test_classwise_ece_by_hand():
    # class 0: p=[.9,.8,.3,.4], y=[1,0,0,0] -> bins (.8,1]: .1, (.6,.8]: .8, (.2,.4]: .7  -> 1.6/4
    # class 1: p=[.1,.2,.7,.6], y=[0,1,1,1] -> bins (0,.2]: |1-.3|, (.6,.8]: .3, (.4,.6]: .4 -> 1.4/4
    assert metrics.classwise_ece(PROBS, LABELS, n_bins=5) == pytest.approx((0.4 + 0.35) / 2, abs=1e-12)


def test_classwise_ece_takes_classes_from_probability_width():
    probs = np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1]])
    labels = np.array([0, 1])  # class 2 never appears, but its p_2 = .1 twice is still miscalibrated
    expected = (0.25 + 0.25 + 0.1) / 3
    assert metrics.classwise_ece(probs, labels, n_bins=10) == pytest.approx(expected, abs=1e-12)


def test_nll_brier_accuracy_by_hand():
    assert metrics.nll(PROBS, LABELS) == pytest.approx(
        -(math.log(0.9) + math.log(0.2) + math.log(0.7) + math.log(0.6)) / 4
    )
    assert metrics.brier(PROBS, LABELS) == pytest.approx((0.02 + 1.28 + 0.18 + 0.32) / 4)
    assert metrics.accuracy(PROBS, LABELS) == pytest.approx(0.75)


def test_nll_of_a_certain_mistake_is_large_but_finite():
    assert metrics.nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-math.log(np.finfo(float).eps))


def test_overconfidence_error_by_hand():
    # only bin (.6,.8] is over-confident: weight 2/4, conf .75, gap .25
    assert metrics.overconfidence_error(PROBS, LABELS, n_bins=5) == pytest.approx(0.5 * 0.75 * 0.25)


def test_debiased_ece_by_hand():
    # one bin of 4 at confidence .95 with accuracy .25: (.7)^2 - .25 * .75 / 3
    probs = np.array([[0.95, 0.05]] * 4)
    labels = np.array([0, 1, 1, 1])
    assert metrics.debiased_ece(probs, labels) == pytest.approx(math.sqrt(0.49 - 0.0625))
    # where the plug-in gap is within sampling noise the debiased estimate is 0
    assert metrics.debiased_ece(PROBS, LABELS, n_bins=5) == 0.0


def test_reliability_bins_by_hand():
    rel = metrics.reliability_bins(PROBS, LABELS, n_bins=5)
    np.testing.assert_allclose(rel.lower, [0.0, 0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(rel.upper, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(rel.count, [0, 0, 1, 2, 1])
    np.testing.assert_allclose(rel.mean_confidence, [np.nan, np.nan, 0.6, 0.75, 0.9])
    np.testing.assert_allclose(rel.accuracy, [np.nan, np.nan, 1.0, 0.5, 1.0])
    records = rel.to_records()
    assert records[0] == {"lo": 0.0, "hi": 0.2, "count": 0, "mean_confidence": None, "accuracy": None}
    assert records[3]["mean_confidence"] == pytest.approx(0.75)


def test_bin_edges_are_closed_on_the_right_with_zero_in_first_and_one_in_last():
    # confidence exactly 0.6 belongs to (0.4, 0.6]; exactly 1.0 to the last bin
    rel = metrics.reliability_bins(np.array([[0.6, 0.4], [1.0, 0.0]]), np.array([0, 0]), n_bins=5)
    np.testing.assert_array_equal(rel.count, [0, 0, 1, 0, 1])
    # p_k = 0 (classwise) falls in the first bin: a perfect one-hot prediction has zero error
    assert metrics.classwise_ece(np.array([[1.0, 0.0]]), np.array([0])) == 0.0


def test_binary_vector_is_the_two_column_matrix():
    rng = np.random.default_rng(3)
    p = rng.random(200)
    y = rng.integers(0, 2, 200)
    two = np.stack([1 - p, p], axis=1)
    for metric in ALL_METRICS:
        assert metric(p, y) == pytest.approx(metric(two, y), abs=1e-12), metric.__name__
    # p > 0.5 predicts the positive class; p = 0.5 predicts class 0 (ties go to the lower index)
    assert metrics.accuracy(np.array([0.51, 0.5]), np.array([1, 0])) == 1.0


def test_calibrated_source_drives_ece_towards_zero():
    eces = []
    for n in (1_000, 10_000, 200_000):
        eces.append(np.mean([metrics.ece(softmax(z), y) for z, y in (calibrated_logits(n, seed=s) for s in range(3))]))
    assert eces[0] > eces[1] > eces[2]
    assert eces[2] < 0.005


def test_over_confident_source_has_large_ece():
    z, y = calibrated_logits(20_000, seed=1)
    assert metrics.ece(softmax(2.5 * z), y) > 0.1
    assert metrics.overconfidence_error(softmax(2.5 * z), y) > 0.05


@st.composite
def predictions(draw, max_n=60):
    n = draw(st.integers(1, max_n))
    k = draw(st.integers(2, 5))
    raw = draw(hnp.arrays(np.float64, (n, k), elements=st.floats(0.001, 1.0)))
    labels = draw(hnp.arrays(np.int64, n, elements=st.integers(0, k - 1)))
    return raw / raw.sum(axis=1, keepdims=True), labels


@settings(max_examples=60, deadline=None)
@given(predictions())
def test_binned_errors_lie_in_unit_interval(data):
    probs, labels = data
    for metric in (metrics.ece, metrics.mce, metrics.adaptive_ece, metrics.classwise_ece, metrics.debiased_ece):
        assert 0.0 <= metric(probs, labels) <= 1.0
    assert metrics.ece(probs, labels) <= metrics.mce(probs, labels) + 1e-12


@settings(max_examples=60, deadline=None)
@given(predictions(), st.randoms(use_true_random=False))
def test_metrics_do_not_depend_on_sample_order(data, random):
    probs, labels = data
    order = np.array(random.sample(range(len(labels)), len(labels)))
    for metric in ALL_METRICS:
        assert metric(probs[order], labels[order]) == pytest.approx(metric(probs, labels), abs=1e-12)


@pytest.mark.parametrize(
    "probs, labels, message",
    [
        (PROBS, LABELS[:3], "labels has 3 entries but the predictions have 4 rows"),
        (PROBS, np.array([0, 1, 2, 1]), r"labels must be in \[0, 2\); 1 are out of range"),
        (PROBS, np.array([0, -1, 1, 1]), "out of range"),
        (PROBS, np.array([0.0, 1.5, 1.0, 1.0]), "whole numbers"),
        (PROBS, np.array(["a", "b", "c", "d"]), "labels must be integers"),
        (PROBS, LABELS.reshape(2, 2), "labels must be 1-D"),
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), np.array([0, 1]), "NaN or infinite"),
        (np.array([[np.inf, 0.0]]), np.array([0]), "NaN or infinite"),
        (np.array([[0.6, 0.6], [0.5, 0.5]]), np.array([0, 1]), "rows must sum to 1.*row 0 sums to 1.2"),
        (np.array([[1.5, -0.5]]), np.array([0]), r"must lie in \[0, 1\]"),
        (np.zeros((0, 3)), np.zeros(0, dtype=int), "empty"),
        (np.ones((2, 1)), np.array([0, 0]), "at least 2 columns"),
        (np.ones((2, 2, 2)) / 2, np.array([0, 0]), r"must be \(N, K\)"),
        ([[0.5, 0.5], [1.0]], [0, 1], "rectangular"),
        (np.array([["x", "y"]]), np.array([0]), "probs must be numeric"),
    ],
)
def test_bad_input_raises_a_named_value_error(probs, labels, message):
    for metric in ALL_METRICS:
        with pytest.raises(ValueError, match=message):
            metric(probs, labels)


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True, "15"])
def test_bad_bin_count_is_rejected(n_bins):
    with pytest.raises(ValueError, match="Expected `n_bins` to be a positive integer"):
        metrics.ece(PROBS, LABELS, n_bins=n_bins)


def test_probabilities_within_tolerance_are_accepted():
    probs = np.array([[0.7, 0.30001], [0.2, 0.8]], dtype=np.float32)
    assert metrics.ece(probs, np.array([0, 1])) == pytest.approx((0.3 + 0.2) / 2, abs=1e-4)
