"""calibkit.significance, .sequential, .drift and .alarms: the statistics behind the alarms."""

import numpy as np
import pytest

from calibkit import binning
from calibkit.alarms import ALARM, OK, WARNING, AlarmPolicy, AlarmStatus, Evidence, assess
from calibkit.drift import accuracy_gap, confidence_shift
from calibkit.sequential import ShiryaevRoberts
from calibkit.significance import EceInterval, consistency_test, ece_interval
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


def test_e_detector_stays_small_on_calibrated_streams_and_grows_after_a_shift():
    peaks = []
    for seed in range(20):
        conf, correct = _stream(10_000, seed=seed)
        detector, peak = ShiryaevRoberts(), 0.0
        for start in range(0, 10_000, 100):
            peak = max(peak, detector.update(correct[start:start + 100], conf[start:start + 100]))
        peaks.append(peak)
    assert max(peaks) < 1e6  # Doob: P(any >= 1e6 within 10^4) <= 1%
    detector = ShiryaevRoberts()
    detector.update(*_stream(2000, seed=99)[::-1])
    conf, correct = _stream(2000, scale=2.5, seed=100)
    needed = next(t for t in range(1, 2001) if detector.update(correct[t - 1:t], conf[t - 1:t]) >= 1e6)
    assert needed < 500


def test_e_detector_round_trip_and_validation():
    detector = ShiryaevRoberts()
    detector.update([1, 0, 1], [0.9, 0.8, 0.7])
    restored = ShiryaevRoberts.from_dict(detector.to_dict())
    assert restored.statistic == detector.statistic and restored.n == 3
    with pytest.raises(ValueError, match="bets must lie in"):
        ShiryaevRoberts(bets=(1.5,))
    with pytest.raises(ValueError, match="confidence must lie"):
        detector.update([1], [1.5])


def test_drift_signals():
    reference = np.random.default_rng(0).beta(8, 1, 1000)
    same = confidence_shift(np.random.default_rng(1).beta(8, 1, 500), reference)
    moved = confidence_shift(np.random.default_rng(2).beta(3, 1, 500), reference)
    assert same.p_value > 0.01 and moved.p_value < 1e-6 and moved.recent_mean < same.recent_mean
    gap = accuracy_gap(1000, confidence_sum=950.0, correct_sum=900.0)
    assert gap.expected == 0.95 and gap.observed == 0.9 and gap.z == pytest.approx(-0.05 / np.sqrt(0.95 * 0.05 / 1000))


POLICY = AlarmPolicy()
WORSE = EceInterval(0.12, 0.09, 0.15, 0.9)


def test_alarm_needs_window_test_and_e_detector():
    both = Evidence(n=500, ece=WORSE, p_value=0.001, e_statistic=2e6, reference_ece=0.02)
    status = assess(AlarmStatus(), both, POLICY, now=10.0)
    assert status.state == ALARM and status.since == 10.0 and len(status.reasons) == 3
    window_only = Evidence(n=500, ece=WORSE, p_value=0.001, e_statistic=10.0, reference_ece=0.02)
    status = assess(AlarmStatus(), window_only, POLICY, now=10.0)
    assert status.state == WARNING and "not yet" in status.reasons[0]
    too_few = Evidence(n=50, ece=WORSE, p_value=0.001, e_statistic=2e6, reference_ece=0.02)
    assert assess(AlarmStatus(), too_few, POLICY, now=1.0).state == OK


def test_threshold_uses_the_reference_plus_margin():
    assert POLICY.threshold(0.01) == 0.025 and POLICY.threshold(0.04) == pytest.approx(0.05)
    evidence = Evidence(n=500, ece=EceInterval(0.07, 0.045, 0.1, 0.9), p_value=0.001, e_statistic=2e6,
                        reference_ece=0.04)
    assert assess(AlarmStatus(), evidence, POLICY, now=1.0).state != ALARM


def test_hysteresis_holds_until_the_upper_bound_is_low():
    alarmed = AlarmStatus(ALARM, ("x",), since=5.0)
    middling = Evidence(n=500, ece=EceInterval(0.03, 0.01, 0.05, 0.9), p_value=0.2, e_statistic=10.0, reference_ece=0.0)
    held = assess(alarmed, middling, POLICY, now=9.0)
    assert held.state == ALARM and held.since == 5.0 and held.reasons[-1].startswith("holding")
    good = Evidence(n=500, ece=EceInterval(0.01, 0.0, 0.02, 0.9), p_value=0.6, e_statistic=10.0, reference_ece=0.0)
    cleared = assess(held, good, POLICY, now=12.0)
    assert cleared.state == OK and cleared.since == 12.0


def test_label_free_warnings():
    from calibkit.drift import AccuracyGap, ShiftTest

    shifted = ShiftTest(0.4, 1e-9, 500, 359, 0.8, 0.97)
    status = assess(AlarmStatus(), Evidence(n=0, shift=shifted), POLICY, now=1.0)
    assert status.state == WARNING and "KS D = 0.400" in status.reasons[0]
    few = ShiftTest(0.4, 1e-9, 20, 359, 0.8, 0.97)
    assert assess(AlarmStatus(), Evidence(n=0, shift=few), POLICY, now=1.0).state == OK
    gap = AccuracyGap(0.97, 0.90, -6.0)
    status = assess(AlarmStatus(), Evidence(n=300, gap=gap), POLICY, now=1.0)
    assert status.state == WARNING and "observed accuracy 0.900" in status.reasons[0]


def test_reference_band_keeps_the_guarantee_and_speeds_up_opposite_shifts():
    # a stable model whose confidences run 0.015 high everywhere: known from its reference, not a shift
    peaks_strict, peaks_band = [], []
    for seed in range(6):
        conf, correct = _stream(10_000, seed=seed)
        conf = np.clip(conf + 0.015, 0, 1)
        strict, band = ShiryaevRoberts(), ShiryaevRoberts(center=-0.015, tolerance=0.01)
        peak_s = peak_b = 0.0
        for start in range(0, 10_000, 250):
            peak_s = max(peak_s, strict.update(correct[start:start + 250], conf[start:start + 250]))
            peak_b = max(peak_b, band.update(correct[start:start + 250], conf[start:start + 250]))
        peaks_strict.append(peak_s)
        peaks_band.append(peak_b)
    assert np.median(peaks_strict) > 1e4  # perfect calibration is (rightly) doubted
    # calibration as good as the reference is not: under the null E[R_t] <= t, far below A = 1e6
    assert max(peaks_band) < 1e5 and np.median(peaks_strict) > 10 * np.median(peaks_band)
    # an under-confident reference (expected residual +0.02): over-confidence is caught sooner than strict
    conf, correct = _stream(2000, scale=2.5, seed=7)
    needed = {}
    for name, detector in {"strict": ShiryaevRoberts(), "band": ShiryaevRoberts(center=0.02, tolerance=0.01)}.items():
        needed[name] = next(t for t in range(1, 2001) if detector.update(correct[t - 1:t], conf[t - 1:t]) >= 1e6)
    assert needed["band"] <= needed["strict"]
    with pytest.raises(ValueError, match="tolerance"):
        ShiryaevRoberts(center=0.25, tolerance=0.1)


def test_vectorised_update_equals_the_recursion_label_by_label():
    conf, correct = _stream(3000, scale=1.6, seed=3)
    batched, stepwise = ShiryaevRoberts(center=0.01, tolerance=0.01), ShiryaevRoberts(center=0.01, tolerance=0.01)
    for start in range(0, 3000, 700):
        batched.update(correct[start:start + 700], conf[start:start + 700])
    lambdas = stepwise._lambdas
    values = np.zeros(len(lambdas))
    for r in correct - conf:
        values = (values + 1.0) * (1.0 + lambdas * (r - 0.01) - np.abs(lambdas) * 0.01)
    np.testing.assert_allclose(batched.values, values, rtol=1e-9)
    assert batched.n == 3000
