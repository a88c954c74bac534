"""calibkit.significance and .drift: the window statistics of the reports and the label-free drift test."""

import numpy as np
import pytest

from calibkit import binning
from calibkit.drift import accuracy_gap, confidence_shift
from calibkit.significance import consistency_test, ece_interval
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

EDGES = binning.equal_width_edges(15)


def _stream(n, scale=1.0, seed=0, logit_scale=8.0):
    z, y = calibrated_logits(n, logit_scale=logit_scale, seed=seed)
    p = softmax(scale * z)
    return p.max(axis=1), (p.argmax(axis=1) == y).astype(float)


def _sums(conf, correct):
    return binning.bin_sums(conf, correct, EDGES)


def test_ece_interval_is_bias_corrected_and_covers_the_truth():
    covered = 0
    for seed in range(40):
        conf, correct = _stream(500, scale=1.6, seed=seed)
        ci = ece_interval(_sums(conf, correct), seed=seed, n_resamples=400)
        assert ci.low <= ci.ece + 1e-12 and ci.low <= ci.high
        covered += ci.low <= 0.053 <= ci.high  # population ECE of this source, measured on 10^6 samples
    assert covered >= 30


def test_ece_interval_stays_in_the_unit_interval_on_a_tiny_miscalibrated_window():
    # ECE 0.74 on four rows; resamples with three right (ECE 0.24) reflect the upper bound past 1
    ci = ece_interval(_sums(np.full(4, 0.99), np.array([1.0, 0.0, 0.0, 0.0])), n_resamples=400)
    assert ci.ece == pytest.approx(0.74) and 0.0 <= ci.low <= ci.ece <= ci.high == 1.0


def test_calibrated_windows_have_low_ece_lower_bounds():
    lows = [ece_interval(_sums(*_stream(500, seed=s)), seed=s).low for s in range(30)]
    assert np.median(lows) < 0.02


def test_consistency_test_is_uniformish_under_the_null_and_rejects_over_confidence():
    null_p = [consistency_test(_sums(*_stream(500, seed=s)), n_resamples=300, seed=s) for s in range(60)]
    assert np.mean(np.array(null_p) < 0.05) <= 0.1  # conservative: at most about its level
    shifted_p = [consistency_test(_sums(*_stream(500, scale=2.5, seed=s)), n_resamples=300, seed=s) for s in range(10)]
    assert max(shifted_p) < 0.01
    assert min(null_p) >= 1 / 301


def test_empty_sums_are_refused():
    empty = binning.BinSums(np.zeros(15), np.zeros(15), np.zeros(15))
    with pytest.raises(ValueError, match="empty"):
        ece_interval(empty)
    with pytest.raises(ValueError, match="empty"):
        consistency_test(empty)


def test_drift_signals():
    reference = np.random.default_rng(0).beta(8, 1, 1000)
    same = confidence_shift(np.random.default_rng(1).beta(8, 1, 500), reference)
    moved = confidence_shift(np.random.default_rng(2).beta(3, 1, 500), reference)
    assert same.p_value > 0.01 and moved.p_value < 1e-6 and moved.recent_mean < same.recent_mean
    gap = accuracy_gap(1000, confidence_sum=950.0, correct_sum=900.0)
    assert gap.expected == 0.95 and gap.observed == 0.9 and gap.z == pytest.approx(-0.05 / np.sqrt(0.95 * 0.05 / 1000))
