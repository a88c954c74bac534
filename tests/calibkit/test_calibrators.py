"""calibkit.calibrators: each calibrator improves an over-confident model and survives JSON."""

import json

import numpy as np
import pytest

from calibkit import metrics
from calibkit.calibrators import (
    CALIBRATORS,
    BiasCorrectedTemperatureScaling,
    HistogramBinning,
    IsotonicCalibration,
    PlattScaling,
    TemperatureScaling,
    VectorScaling,
    build_calibrator,
    calibrator_from_dict,
    load_calibrator,
    save_calibrator,
)
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

MULTICLASS = ["temperature", "vector", "bcts", "histogram", "isotonic"]


@pytest.fixture(scope="module")
def over_confident():
    z, y = calibrated_logits(12_000, n_classes=5, seed=21)
    z = 2.5 * z
    return (z[:6000], y[:6000]), (z[6000:], y[6000:])


@pytest.fixture(scope="module")
def binary_over_confident():
    rng = np.random.default_rng(22)
    s = rng.normal(0, 2.5, 12_000)
    y = (rng.random(12_000) < 1 / (1 + np.exp(-s))).astype(int)
    s = 2.5 * s + 1.0  # over-confident and shifted: Platt's a and b both matter
    return (s[:6000], y[:6000]), (s[6000:], y[6000:])


@pytest.mark.parametrize("method", MULTICLASS)
def test_calibrator_reduces_ece_on_held_out_data(method, over_confident):
    (z_val, y_val), (z_test, y_test) = over_confident
    before = metrics.ece(softmax(z_test), y_test)
    q = build_calibrator(method).fit(z_val, y_val).transform(z_test)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-9)
    assert before > 0.1
    assert metrics.ece(q, y_test) < 0.05


@pytest.mark.parametrize("method", MULTICLASS + ["platt"])
def test_binary_single_logit_round_trip(method, binary_over_confident):
    (s_val, y_val), (s_test, y_test) = binary_over_confident
    cal = build_calibrator(method).fit(s_val, y_val)
    q = cal.transform(s_test)
    assert q.shape == s_test.shape
    assert metrics.ece(q, y_test) < metrics.ece(1 / (1 + np.exp(-s_test)), y_test)
    two_column = np.stack([np.zeros_like(s_test), s_test], axis=1)
    np.testing.assert_allclose(cal.transform(two_column)[:, 1], q, atol=1e-9)


def test_platt_recovers_slope_and_intercept(binary_over_confident):
    (s_val, y_val), _ = binary_over_confident
    platt = PlattScaling().fit(s_val, y_val)
    assert platt.a == pytest.approx(1 / 2.5, rel=0.1)
    assert platt.b == pytest.approx(-1.0 / 2.5, abs=0.1)


def test_platt_refuses_multiclass(over_confident):
    (z, y), _ = over_confident
    with pytest.raises(ValueError, match="Platt scaling is for binary problems, got 5 classes"):
        PlattScaling().fit(z, y)


def test_temperature_calibrator_matches_fit_temperature(over_confident):
    (z, y), _ = over_confident
    cal = TemperatureScaling().fit(z, y)
    assert cal.temperature == pytest.approx(2.5, rel=0.06)
    assert TemperatureScaling(objective="ece").fit(z, y).temperature == pytest.approx(2.5, abs=0.25)


def test_vector_scaling_starts_from_and_generalises_temperature(over_confident):
    (z, y), _ = over_confident
    vec = VectorScaling().fit(z, y)
    np.testing.assert_allclose(vec.w, 1 / 2.5, rtol=0.1)
    np.testing.assert_allclose(vec.b - vec.b.mean(), 0.0, atol=0.1)


def test_bcts_recovers_the_temperature_and_a_class_prior_bias():
    """Labels from softmax(z), served as 2.5 z with 1 added to class 0's logit: BCTS finds T = 2.5 and b_0 - b_k =
    -1 / 2.5, where temperature scaling alone cannot undo the bias; stored with mean-zero biases."""
    z, y = calibrated_logits(20_000, n_classes=5, seed=23)
    served = 2.5 * z
    served[:, 0] += 1.0
    (z_val, y_val), (z_test, y_test) = (served[:10_000], y[:10_000]), (served[10_000:], y[10_000:])
    bcts = BiasCorrectedTemperatureScaling().fit(z_val, y_val)
    assert bcts.temperature == pytest.approx(2.5, rel=0.05)
    np.testing.assert_allclose(bcts.b[0] - bcts.b[1:], -1.0 / 2.5, atol=0.08)
    assert bcts.b.mean() == pytest.approx(0.0, abs=1e-12)
    temperature = TemperatureScaling().fit(z_val, y_val)
    # the class-0 rate the probabilities promise against the one observed: BCTS closes the gap temperature leaves
    observed = np.mean(y_test == 0)
    assert abs(bcts.transform(z_test)[:, 0].mean() - observed) < 0.01
    assert abs(temperature.transform(z_test)[:, 0].mean() - observed) > 0.02
    assert metrics.nll(bcts.transform(z_test), y_test) < metrics.nll(temperature.transform(z_test), y_test)


def test_bcts_is_nested_between_temperature_and_vector_scaling(over_confident):
    """On the data it is fitted on, BCTS's NLL is at most temperature scaling's (b = 0) and at least vector scaling's
    (w = 1 / T); as vector scaling with every w_k = 1 / T it gives the same probabilities (how the export bakes it)."""
    (z, y), (z_test, _) = over_confident
    nll = {m: metrics.nll(build_calibrator(m).fit(z, y).transform(z), y) for m in ("temperature", "bcts", "vector")}
    assert nll["vector"] <= nll["bcts"] + 1e-9 and nll["bcts"] <= nll["temperature"] + 1e-9
    bcts = BiasCorrectedTemperatureScaling().fit(z, y)
    as_vector = VectorScaling.from_dict(
        {"method": "vector", "n_classes": 5, "params": {"w": [1.0 / bcts.temperature] * 5, "b": bcts.b.tolist()}}
    )
    np.testing.assert_allclose(as_vector.transform(z_test), bcts.transform(z_test), atol=1e-12)


@pytest.mark.parametrize("method", MULTICLASS)
def test_json_round_trip_gives_identical_outputs(method, over_confident, tmp_path):
    (z_val, y_val), (z_test, _) = over_confident
    cal = build_calibrator(method).fit(z_val, y_val)
    path = tmp_path / f"{method}.json"
    save_calibrator(cal, path)
    json.loads(path.read_text())
    restored = load_calibrator(path)
    assert type(restored) is type(cal)
    np.testing.assert_array_equal(restored.transform(z_test), cal.transform(z_test))
    assert calibrator_from_dict(cal.to_dict()).to_dict() == cal.to_dict()


def test_histogram_binning_values_are_bin_frequencies():
    z = np.log(np.array([[0.95, 0.05]] * 4 + [[0.05, 0.95]] * 4))
    y = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    cal = HistogramBinning(n_bins=10).fit(z, y)
    # class 0 probability .95 (bin 9): 3 of 4 are class 0; class 1 probability .95: 4 of 4
    assert cal.theta[0, 9] == pytest.approx(0.75)
    assert cal.theta[1, 9] == pytest.approx(1.0)
    assert cal.theta[0, 4] == pytest.approx(0.45)  # empty bin: its midpoint


def test_isotonic_output_is_monotone_per_class(over_confident):
    (z_val, y_val), (z_test, _) = over_confident
    cal = IsotonicCalibration().fit(z_val, y_val)
    for k in range(5):
        assert np.all(np.diff(cal.y[k]) >= 0)


@pytest.mark.parametrize("method", list(CALIBRATORS))
def test_unfitted_calibrator_refuses(method):
    cal = build_calibrator(method)
    with pytest.raises(ValueError, match="not fitted"):
        cal.transform(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="not fitted"):
        cal.to_dict()


def test_width_mismatch_and_unknown_method(over_confident):
    (z, y), _ = over_confident
    cal = TemperatureScaling().fit(z, y)
    with pytest.raises(ValueError, match="logits have 3 classes but the calibrator was fitted on 5"):
        cal.transform(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="unknown calibration method 'beta'; known: temperature, vector"):
        build_calibrator("beta")
    with pytest.raises(ValueError, match="unknown calibration method"):
        calibrator_from_dict({"method": "beta"})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"method": "temperature", "n_classes": 3, "params": {"temperature": -1}}, "positive finite"),
        ({"method": "temperature", "n_classes": 3, "params": {}}, "params are malformed"),
        (
            {"method": "temperature", "n_classes": 1, "params": {"temperature": 1}},
            "Expected `n_classes` to be an integer >= 2",
        ),
        (
            {"method": "vector", "n_classes": 3, "params": {"w": [1, 1], "b": [0, 0, 0]}},
            "Expected `w` to be 3 finite numbers",
        ),
        ({"method": "bcts", "n_classes": 3, "params": {"temperature": 0, "b": [0, 0, 0]}}, "Expected `temperature`"),
        (
            {"method": "bcts", "n_classes": 3, "params": {"temperature": 1, "b": [0, 0]}},
            "Expected `b` to be 3 finite numbers",
        ),
        ({"method": "platt", "n_classes": 3, "params": {"a": 1, "b": 0}}, "Expected `n_classes` to be 2"),
        ({"method": "histogram", "n_classes": 2, "params": {"n_bins": 2, "theta": [[2, 0], [0, 0]]}}, "values in"),
        (
            {"method": "isotonic", "n_classes": 2, "params": {"x": [[0, 1]], "y": [[0, 1]]}},
            "one breakpoint list per class",
        ),
        ({"method": "isotonic", "n_classes": 2, "params": {"x": [[1, 0], [0, 1]], "y": [[0, 1], [0, 1]]}}, "sorted"),
        ({"n_classes": 2}, "unknown calibration method None"),
    ],
)
def test_from_dict_rejects_bad_parameters(data, message):
    with pytest.raises(ValueError, match=message):
        calibrator_from_dict(data)
