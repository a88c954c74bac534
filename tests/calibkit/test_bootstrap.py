"""calibkit.bootstrap.confidence_interval."""

import numpy as np
import pytest

from calibkit import metrics
from calibkit.bootstrap import confidence_interval, confidence_intervals, hierarchical_bootstrap
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax


def _data(n, seed=0, scale=2.0):
    z, y = calibrated_logits(n, seed=seed)
    return softmax(scale * z), y


@pytest.mark.parametrize("metric", [metrics.nll, metrics.brier, metrics.accuracy])
def test_interval_of_a_mean_brackets_the_estimate(metric):
    probs, labels = _data(500)
    ci = confidence_interval(metric, probs, labels, n_resamples=200, seed=1)
    assert ci.estimate == pytest.approx(metric(probs, labels))
    assert ci.low < ci.estimate < ci.high
    assert ci.level == 0.9


@pytest.mark.parametrize("metric", [metrics.ece, metrics.mce, metrics.adaptive_ece, metrics.classwise_ece])
def test_binned_error_intervals_are_ordered_and_basic_corrects_the_upward_bias(metric):
    probs, labels = _data(500)
    pct = confidence_interval(metric, probs, labels, n_resamples=200, seed=1)
    basic = confidence_interval(metric, probs, labels, n_resamples=200, seed=1, method="basic")
    assert 0.0 <= pct.low <= pct.high <= 1.0
    # resampling inflates binned errors, so the percentile interval sits higher than the basic one
    assert pct.low + pct.high > 2 * pct.estimate
    assert basic.low < pct.low and basic.high < pct.high
    assert basic.high - basic.low == pytest.approx(pct.high - pct.low)


def test_deterministic_given_a_seed_and_varies_with_it():
    probs, labels = _data(300)
    a = confidence_interval(metrics.ece, probs, labels, n_resamples=100, seed=3)
    b = confidence_interval(metrics.ece, probs, labels, n_resamples=100, seed=3)
    c = confidence_interval(metrics.ece, probs, labels, n_resamples=100, seed=4)
    assert a == b
    assert a != c


def test_interval_narrows_with_more_data_and_covers_the_population_value():
    small = confidence_interval(metrics.accuracy, *_data(400, seed=1), n_resamples=300)
    large = confidence_interval(metrics.accuracy, *_data(10_000, seed=2), n_resamples=300)
    assert (large.high - large.low) < 0.4 * (small.high - small.low)
    population = metrics.accuracy(*_data(400_000, seed=3))
    assert large.low <= population <= large.high


def test_higher_level_gives_a_wider_interval():
    probs, labels = _data(500)
    narrow = confidence_interval(metrics.ece, probs, labels, n_resamples=300, level=0.5)
    wide = confidence_interval(metrics.ece, probs, labels, n_resamples=300, level=0.99)
    assert wide.low <= narrow.low and narrow.high <= wide.high


def test_binary_vector_input_reaches_the_metric_as_a_vector():
    rng = np.random.default_rng(0)
    p, y = rng.random(200), rng.integers(0, 2, 200)
    seen = []
    confidence_interval(lambda pp, yy: seen.append(pp.ndim) or metrics.ece(pp, yy), p, y, n_resamples=5)
    assert set(seen) == {1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_resamples": 0}, "Expected `n_resamples` to be an integer >= 1"),
        ({"level": 1.0}, r"Expected `level` to be in \(0, 1\)"),
        ({"method": "normal"}, "Expected `method` to be 'percentile', 'basic' or 'BCa'"),
    ],
)
def test_bad_arguments(kwargs, message):
    probs, labels = _data(10)
    with pytest.raises(ValueError, match=message):
        confidence_interval(metrics.ece, probs, labels, **kwargs)
    with pytest.raises(ValueError, match="labels has 9 entries"):
        confidence_interval(metrics.ece, probs, labels[:9])


def test_several_metrics_share_resamples_and_match_single_calls():
    probs, labels = _data(300)
    chosen = {"ece": metrics.ece, "nll": metrics.nll, "accuracy": metrics.accuracy}
    together = confidence_intervals(chosen, probs, labels, n_resamples=150, seed=9)
    assert list(together) == ["ece", "nll", "accuracy"]
    for name, metric in chosen.items():
        assert together[name] == confidence_interval(metric, probs, labels, n_resamples=150, seed=9)
    with pytest.raises(ValueError, match="at least one metric"):
        confidence_intervals({}, probs, labels)


def _runs(n_runs, n=300, scale=2.0):
    runs = []
    for s in range(n_runs):
        probs, labels = _data(n, seed=s, scale=scale)
        runs.append({"labels": labels, "a": probs, "b": softmax(np.log(probs) * 1.5)})
    return runs


def _ece_of(key):
    return lambda run: metrics.ece(run[key], run["labels"])


def test_hierarchical_bootstrap_means_over_runs_and_pairs_contrasts():
    runs = _runs(4)
    boot = hierarchical_bootstrap(
        {"a": _ece_of("a"), "b": _ece_of("b"), "a again": _ece_of("a")}, runs, n_resamples=100, seed=2
    )
    per_run = [metrics.ece(run["a"], run["labels"]) for run in runs]
    assert boot.per_run.shape == (4, 3) and boot.resampled.shape == (100, 3)
    assert boot.mean("a") == pytest.approx(np.mean(per_run))
    assert boot.sd("a") == pytest.approx(np.std(per_run, ddof=1))
    ci = boot.interval("a")
    assert ci.estimate == pytest.approx(np.mean(per_run)) and ci.low < ci.high and ci.level == 0.9
    # the same predictions on the same resampled rows: the paired contrast is exactly zero
    assert tuple(boot.interval({"a": 1, "a again": -1}))[:3] == (0.0, 0.0, 0.0)
    # over-confident b (logits x 1.5) has the larger ECE on every run and every resample
    contrast = boot.interval({"b": 1, "a": -1})
    assert contrast.low > 0 and contrast.estimate == pytest.approx(boot.mean("b") - boot.mean("a"))
    basic, pct = boot.interval("a"), boot.interval("a", method="percentile")
    assert basic.high - basic.low == pytest.approx(pct.high - pct.low)


def test_hierarchical_bootstrap_carries_the_spread_between_runs():
    runs = _runs(5, n=200)
    for run, scale in zip(runs, (1.0, 1.3, 1.6, 1.9, 2.2)):  # runs that differ much more than rows do
        run["a"] = softmax(np.log(run["a"]) * scale)
    boot = hierarchical_bootstrap({"a": _ece_of("a")}, runs, n_resamples=300, seed=0)
    one_run = hierarchical_bootstrap({"a": _ece_of("a")}, runs[2:3], n_resamples=300, seed=0)
    width = boot.interval("a").high - boot.interval("a").low
    assert width > 2 * boot.sd("a") / np.sqrt(5)  # at least the width of +-1 standard error over runs
    assert one_run.sd("a") == 0.0 and one_run.per_run.shape == (1, 1)
    a = hierarchical_bootstrap({"a": _ece_of("a")}, runs, n_resamples=50, seed=7)
    b = hierarchical_bootstrap({"a": _ece_of("a")}, runs, n_resamples=50, seed=7)
    assert np.array_equal(a.resampled, b.resampled)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_resamples": 0}, "Expected `n_resamples` to be an integer >= 1"),
        ({"statistics": {}}, "at least one statistic"),
        ({"runs": []}, "at least one run"),
        (
            {"runs": [{"labels": np.zeros(3, int), "a": np.full((2, 2), 0.5)}]},
            r"Expected `runs\[0\]` to hold non-empty arrays of one length",
        ),
    ],
)
def test_hierarchical_bootstrap_bad_arguments(kwargs, message):
    arguments = {"statistics": {"a": _ece_of("a")}, "runs": _runs(2, n=20), "n_resamples": 5} | kwargs
    with pytest.raises(ValueError, match=message):
        hierarchical_bootstrap(**arguments)
    boot = hierarchical_bootstrap({"a": _ece_of("a")}, _runs(2, n=20), n_resamples=5)
    with pytest.raises(ValueError, match=r"unknown statistics \['c'\]"):
        boot.interval({"c": 1})
    with pytest.raises(ValueError, match="Expected `method` to be 'percentile' or 'basic'"):
        boot.interval("a", method="BCa")
