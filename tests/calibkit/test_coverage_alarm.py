"""calibkit.coverage_alarm: the false-alarm rate at the least favourable null, detection, folds and JSON forms."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibkit.coverage_alarm import (
    DEFAULT_LABELS,
    DEFAULT_RATE,
    DEFAULT_THRESHOLD,
    CoverageAlarmConfig,
    CoverageAlarmState,
    calibration_tolerance,
)
from calibkit.eprocess import threshold_for


def _misses(rng: np.random.Generator, rate, shape) -> np.ndarray:
    return (rng.random(shape) < rate).astype(np.int64)


def test_false_alarms_at_the_target_rate_stay_under_one_percent_per_10000_labels():
    """Seeded: 2,000 streams of 10,000 i.i.d. misses at exactly alpha, the least favourable null. At a rate of 1%
    the count of streams that raise would be Binomial(2,000, 0.01), at most 10 with probability about 1%."""
    config = CoverageAlarmConfig(alpha=0.1)
    state = CoverageAlarmState.fresh(config, 2_000).fold(_misses(np.random.default_rng(0), 0.1, (2_000, 10_000)))
    assert state.alarmed.sum() <= 10
    assert config.threshold == DEFAULT_THRESHOLD


def test_a_null_below_the_target_raises_less_than_at_the_target():
    """The coupling of the module docstring: the same uniforms at a lower miss rate never raise where the rate
    at alpha did not."""
    rng = np.random.default_rng(1)
    u = rng.random((300, 5_000))
    config = CoverageAlarmConfig(alpha=0.1, threshold=200.0)
    at = CoverageAlarmState.fresh(config, 300).fold((u < 0.1).astype(int))
    below = CoverageAlarmState.fresh(config, 300).fold((u < np.linspace(0.0, 0.1, 5_000)).astype(int))
    assert at.alarmed.sum() > 0
    assert not np.any(below.alarmed & ~at.alarmed)
    assert np.all(below.log_statistic <= at.log_statistic + 1e-12)


def test_a_drop_in_coverage_is_detected():
    rng = np.random.default_rng(2)
    state = CoverageAlarmState.fresh(CoverageAlarmConfig(alpha=0.1), 100).fold(_misses(rng, 0.15, (100, 6_000)))
    assert state.alarmed.mean() > 0.95
    assert 300 < np.median(state.raised_at) < 3_000


def test_bets_are_the_likelihood_ratios_of_the_rates():
    config = CoverageAlarmConfig(alpha=0.1, rises=(0.5, 100.0))
    assert config.rates.tolist() == pytest.approx([0.15, 0.55])
    assert np.exp(config.log_e[1]).tolist() == pytest.approx((config.rates / 0.1).tolist())
    assert np.exp(config.log_e[0]).tolist() == pytest.approx(((1 - config.rates) / 0.9).tolist())


def test_folding_in_chunks_gives_the_same_raises_and_the_statistics_to_rounding():
    errs = _misses(np.random.default_rng(3), 0.16, (7, 3_001))
    config = CoverageAlarmConfig(alpha=0.1, threshold=1e3)
    whole = CoverageAlarmState.fresh(config, 7).fold(errs)
    chunked = CoverageAlarmState.fresh(config, 7)
    for part in np.array_split(errs, [1, 17, 1_000, 1_001, 2_500], axis=1):
        chunked = chunked.fold(part)
    assert whole.raised_at.tolist() == chunked.raised_at.tolist() and whole.labels == chunked.labels
    np.testing.assert_allclose(whole.log_statistic, chunked.log_statistic, rtol=1e-12, atol=1e-9)  # cumsum rounding
    assert whole.alarmed.any()
    single = CoverageAlarmState.fresh(config)
    for e in errs[3]:
        single = single.fold(int(e))
    np.testing.assert_allclose(single.log_statistic, whole.log_statistic[3:4], rtol=1e-12, atol=1e-9)
    assert single.raised_at[0] == whole.raised_at[3]


def test_to_dict_round_trips_exactly_through_json():
    config = CoverageAlarmConfig(alpha=0.07, threshold=1e4, rises=(0.3, 1.1), weights=(1.0, 3.0))
    state = CoverageAlarmState.fresh(config).fold(_misses(np.random.default_rng(4), 0.09, 2_345))
    back = CoverageAlarmState.from_dict(json.loads(json.dumps(state.to_dict())), config)
    assert back == state
    assert back.log_statistic.tobytes() == state.log_statistic.tobytes()
    # saved under other settings: not this alarm's evidence
    other = CoverageAlarmState.from_dict(state.to_dict(), CoverageAlarmConfig(alpha=0.07))
    assert other == CoverageAlarmState.fresh(CoverageAlarmConfig(alpha=0.07))


def test_threshold_for_is_the_union_bound():
    assert threshold_for(10_000, 0.01) == 1e6
    assert threshold_for(DEFAULT_LABELS, DEFAULT_RATE) == 1e6


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: CoverageAlarmConfig(alpha=0.0), "alpha"),
        (lambda: CoverageAlarmConfig(alpha=1.0), "alpha"),
        (lambda: CoverageAlarmConfig(alpha=True), "alpha"),
        (lambda: CoverageAlarmConfig(threshold=1.0), "threshold"),
        (lambda: CoverageAlarmConfig(threshold=float("inf")), "threshold"),
        (lambda: CoverageAlarmConfig(rises=()), "rises"),
        (lambda: CoverageAlarmConfig(rises=(0.5, -1.0)), "rises"),
        (lambda: CoverageAlarmConfig(weights=(1.0,)), "weights"),
        (lambda: CoverageAlarmConfig(weights=(1.0, 1.0, 0.0, 1.0)), "weights"),
        (lambda: CoverageAlarmState.fresh(streams=0), "streams"),
        (lambda: CoverageAlarmState.fresh().fold([0, 3]), "errs"),
        (lambda: CoverageAlarmState.fresh(streams=2).fold([0, 1]), "errs"),
        (lambda: CoverageAlarmState.fresh(streams=2).to_dict(), "streams"),
        (lambda: threshold_for(0, 0.01), "labels"),
        (lambda: threshold_for(10, 1.0), "rate"),
    ],
)
def test_bad_arguments_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()


@pytest.mark.parametrize("n", [50, 180, 1_000])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_the_calibration_tolerance_is_exceeded_by_at_most_epsilon_of_the_splits(n, alpha):
    """Over 4,000 seeded calibration splits of continuous scores, the share whose static set misses more than alpha
    + delta (its exact miss rate, 1 - F(q) for uniform scores) is at most epsilon = 1%, within sampling error; a
    tolerance of 0 would be exceeded by a quarter to a half of them."""
    rng = np.random.default_rng(int(n * 100 + alpha * 1000))
    delta = calibration_tolerance(n, alpha)
    k = min(int(np.ceil((n + 1) * (1 - alpha))), n)
    q = np.sort(rng.uniform(size=(4_000, n)), axis=1)[:, k - 1]  # the static quantile of uniform scores
    exceeded = np.mean(1 - q > alpha + delta)
    assert exceeded <= 0.01 + 3 * np.sqrt(0.01 * 0.99 / 4_000)
    assert np.mean(1 - q > alpha) > 0.2
    assert calibration_tolerance(5, 0.1) == 0.0  # too few scores: the full set, which misses nothing
