"""Every refused argument is named in its error with the value given, as in
"Expected `max_bet` to be in (0, 1), but got 1.5"."""

import numpy as np
import pytest

from calibkit import binning, metrics
from calibkit.bootstrap import confidence_interval, confidence_intervals, hierarchical_bootstrap
from calibkit.calibrators import HistogramBinning, TemperatureScaling, calibrator_from_dict
from calibkit.detector import DetectorConfig, DetectorState
from calibkit.drift import accuracy_gap, confidence_shift
from calibkit.manifest import InputSpec, ReferenceDistribution
from calibkit.significance import ece_interval
from calibkit.stats import BinStats
from calibkit.temperature import apply_temperature, fit_temperature

PROBS = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
LABELS = np.array([0, 1, 1, 1])
SUMS = binning.bin_sums(np.array([0.9, 0.8]), np.array([1.0, 0.0]), binning.equal_width_edges(5))
RUN = {"labels": LABELS, "probs": PROBS}


def test_the_detector_config_names_the_setting_and_its_value():
    with pytest.raises(ValueError) as error:
        DetectorConfig(max_bet=1.5)
    assert str(error.value) == "Expected `max_bet` to be in (0, 1), but got 1.5"


@pytest.mark.parametrize(
    "settings, name, shown",
    [
        ({"tolerance": 0.5}, "tolerance", "0.5"),
        ({"threshold": 1.0}, "threshold", "1.0"),
        ({"clear_threshold": 0.5}, "clear_threshold", "0.5"),
        ({"edges": (0.5, 0.2)}, "edges", "(0.5, 0.2)"),
        ({"clear_edges": (0.2, 1.5)}, "clear_edges", "(0.2, 1.5)"),
        ({"half_lives": (10.0, -1.0)}, "half_lives", "(10.0, -1.0)"),
        ({"half_lives": ()}, "half_lives", "()"),
        ({"prior_labels": 0.0}, "prior_labels", "0.0"),
        ({"max_bet": 0.0}, "max_bet", "0.0"),
        ({"clear_shrink": 1.5}, "clear_shrink", "1.5"),
        ({"clear_prior_labels": -2.0}, "clear_prior_labels", "-2.0"),
        ({"block": 0}, "block", "0"),
        ({"min_clear_labels": -1}, "min_clear_labels", "-1"),
        ({"adaptive_prior": 5}, "adaptive_prior", "5"),
        ({"scales": (0.5, 1.0)}, "scales", "(0.5, 1.0)"),
        ({"gaps": (0.005,)}, "gaps", "(0.005,)"),
        ({"steps": (1.5,)}, "steps", "(1.5,)"),
        ({"pivots": ()}, "pivots", "()"),
        ({"steps": ()}, "steps", "()"),
        ({"scale_weight": -0.1}, "scale_weight", "-0.1"),
        ({"step_weight": -0.1}, "step_weight", "-0.1"),
        ({"scale_weight": 0.6, "step_weight": 0.5}, "scale_weight + step_weight", "1.1"),
        ({"scale_weight": 0.0}, "scale_weight", "0.0"),
        ({"step_weight": 0.0}, "step_weight", "0.0"),
    ],
    ids=lambda value: None if isinstance(value, dict) else str(value),
)
def test_each_detector_setting_is_named_with_its_value(settings, name, shown):
    with pytest.raises(ValueError) as error:
        DetectorConfig(**settings)
    message = str(error.value)
    assert message.startswith(f"Expected `{name}` to be ") and message.endswith(f", but got {shown}"), message


def _refusals():
    """(id, call, the parameter it names, the value it shows)."""
    runs_of_two_lengths = [{"labels": LABELS, "probs": PROBS[:3]}]
    return [
        ("n_bins", lambda: metrics.ece(PROBS, LABELS, n_bins=0), "n_bins", "0"),
        ("norm", lambda: binning.calibration_error(SUMS, "l2"), "norm", "'l2'"),
        ("n_resamples", lambda: confidence_interval(metrics.ece, PROBS, LABELS, n_resamples=0), "n_resamples", "0"),
        ("level", lambda: confidence_interval(metrics.ece, PROBS, LABELS, level=1.0), "level", "1.0"),
        ("method", lambda: confidence_interval(metrics.ece, PROBS, LABELS, method="normal"), "method", "'normal'"),
        ("metrics", lambda: confidence_intervals({}, PROBS, LABELS), "metrics", "{}"),
        ("statistics", lambda: hierarchical_bootstrap({}, [RUN]), "statistics", "{}"),
        ("runs", lambda: hierarchical_bootstrap({"n": lambda run: 0.0}, []), "runs", "[]"),
        (
            "runs[0]",
            lambda: hierarchical_bootstrap({"n": lambda run: 0.0}, runs_of_two_lengths),
            "runs[0]",
            "lengths [3, 4]",
        ),
        (
            "interval level",
            lambda: hierarchical_bootstrap({"n": lambda run: 0.0}, [RUN], n_resamples=2).interval("n", level=2),
            "level",
            "2",
        ),
        (
            "interval method",
            lambda: hierarchical_bootstrap({"n": lambda run: 0.0}, [RUN], n_resamples=2).interval("n", method="BCa"),
            "method",
            "'BCa'",
        ),
        ("ece_interval level", lambda: ece_interval(SUMS, level=1.5), "level", "1.5"),
        ("temperature", lambda: apply_temperature(np.zeros((1, 2)), -1), "temperature", "-1"),
        ("temperature type", lambda: apply_temperature(np.zeros((1, 2)), "hot"), "temperature", "'hot'"),
        ("objective", lambda: fit_temperature(np.zeros((2, 2)), [0, 1], objective="brier"), "objective", "'brier'"),
        ("recent", lambda: confidence_shift([], [0.5]), "recent", "[]"),
        ("reference", lambda: confidence_shift([0.5], []), "reference", "[]"),
        ("n", lambda: accuracy_gap(0, 0.0, 0.0), "n", "0"),
        ("data", lambda: calibrator_from_dict({"method": "temperature"}), "data", "['method']"),
        (
            "data method",
            lambda: TemperatureScaling.from_dict({"method": "vector", "n_classes": 2, "params": {}}),
            "method",
            "'vector'",
        ),
        (
            "n_classes",
            lambda: calibrator_from_dict({"method": "temperature", "n_classes": 1, "params": {"temperature": 1}}),
            "n_classes",
            "1",
        ),
        (
            "calibrator temperature",
            lambda: calibrator_from_dict({"method": "temperature", "n_classes": 2, "params": {"temperature": -1}}),
            "temperature",
            "-1.0",
        ),
        (
            "w",
            lambda: calibrator_from_dict({"method": "vector", "n_classes": 3, "params": {"w": [1, 1], "b": [0, 0, 0]}}),
            "w",
            "[1.0, 1.0]",
        ),
        (
            "bcts temperature",
            lambda: calibrator_from_dict({"method": "bcts", "n_classes": 2, "params": {"temperature": 0, "b": [0, 0]}}),
            "temperature",
            "0.0",
        ),
        (
            "platt n_classes",
            lambda: calibrator_from_dict({"method": "platt", "n_classes": 3, "params": {"a": 1, "b": 0}}),
            "n_classes",
            "3",
        ),
        (
            "theta",
            lambda: HistogramBinning.from_dict(
                {"method": "histogram", "n_classes": 2, "params": {"n_bins": 2, "theta": [[2, 0], [0, 0]]}}
            ),
            "theta",
            "shape (2, 2) with values in [0, 2]",
        ),
        (
            "isotonic count",
            lambda: calibrator_from_dict(
                {"method": "isotonic", "n_classes": 2, "params": {"x": [[0, 1]], "y": [[0, 1]]}}
            ),
            "x` and `y",
            "1 and 1",
        ),
        (
            "isotonic order",
            lambda: calibrator_from_dict(
                {"method": "isotonic", "n_classes": 2, "params": {"x": [[1, 0], [0, 1]], "y": [[0, 1], [0, 1]]}}
            ),
            "x[0]` and `y[0]",
            "shapes (2,) and (2,), `x[0]` unsorted",
        ),
        ("stats n_classes", lambda: BinStats.empty(1), "n_classes", "1"),
        (
            "class sums without classes",
            lambda: BinStats(None, class_count=np.zeros((2, 15))),
            "class_count",
            "an array of shape (2, 15)",
        ),
        ("stats shape", lambda: BinStats(2, n_bins=15, count=np.zeros(2)), "count", "(2,)"),
        ("stats sums", lambda: BinStats(2, n_bins=2, correct_sum=[-1.0, 0.0]), "correct_sum", "values in [-1, 0]"),
        (
            "add_bins shapes",
            lambda: BinStats.empty(None, 2).add_bins([0, 1], [1], [0.5], [1]),
            "bins`, `count`, `confidence_sum` and `correct_sum",
            "shapes (2,), (1,), (1,), (1,)",
        ),
        ("add_bins index", lambda: BinStats.empty(None, 2).add_bins([2], [1], [0.5], [1]), "bins", "2"),
        (
            "add_bins sums",
            lambda: BinStats.empty(None, 2).add_bins([1], [-4], [0.5], [1]),
            "count",
            "values in [-4, 0]",
        ),
        ("streams", lambda: DetectorState(DetectorConfig(), streams=2).to_dict(), "streams", "2"),
        (
            "fold shapes",
            lambda: DetectorState(DetectorConfig(), streams=2).fold([0.9, 0.8, 0.7], [1, 0, 1]),
            "confidence` and `correct",
            "(3,) and (3,)",
        ),
        ("input shape", lambda: InputSpec(name="input", shape=[4, 1, 8, 8]), "shape", "[4, 1, 8, 8]"),
        (
            "confidences",
            lambda: ReferenceDistribution(confidences=[0.5, 1.5], accuracy=0.8, ece=0.02),
            "confidences",
            "1.5",
        ),
    ]


@pytest.mark.parametrize("call, name, shown", [r[1:] for r in _refusals()], ids=[r[0] for r in _refusals()])
def test_each_refusal_names_the_parameter_and_the_value(call, name, shown):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert f"Expected `{name}` to " in message and f"but got {shown}" in message, message


def test_a_state_whose_streams_disagree_says_how_many_labels_each_has_seen():
    state = DetectorState(DetectorConfig(), streams=2, n=[16, 32])
    with pytest.raises(ValueError, match=r"same number of labels, but got \[16, 32\]"):
        state.fold([0.9, 0.8], [1, 0])
