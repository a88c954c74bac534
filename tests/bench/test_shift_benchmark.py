"""The shift benchmark (bench/shift): a tiny run has every row, goal and section, and says when CBPE did not run; on
seeded synthetic windows, the oracle's adaptation lowers the NLL under label shift, EM's priors land nearer the
window's class frequencies than the unadapted source priors, and the 95% Poisson-binomial interval holds the
realized accuracy of a calibrated source about 95% of the time (a binomial bound on the count); the label-shift
alarm stays silent on unshifted streams and raises on a strong shift, later than the oracle told it; the sets that
the benchmark counts are ``prediction_sets``', and under a shift toward the hard class the weighted sets cover more
than the unweighted ones."""

import argparse

import numpy as np
import pytest
from scipy import stats

from bench.shift import alarm, goals, measure, render, sets
from bench.shift.streams import (
    CIFAR_LIKE,
    SYNTHETIC,
    Scenario,
    draw_windows,
    scenarios,
    synthetic_source,
)
from calibkit.conformal import label_shift_quantiles, prediction_sets
from calibkit.label_shift import em_priors
from calibkit.label_shift_alarm import LabelShiftAlarmConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    missing = tmp_path_factory.mktemp("no-venv") / "python"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "CBPE_PYTHON", missing)
        patch.setattr(measure, "ROOT", missing.parent.parent)
        args = argparse.Namespace(seed=0, pool_rows=5_000, windows=(100, 2_000), streams=3, alarm_length=300)
        result = measure.run(args)
    result["goals"] = goals.goals(result)
    return result


def test_a_tiny_run_has_every_row_goal_and_section(tiny):
    rows = tiny["rows"]
    # digits and cifar-like: none, 3 alphas, 5 severities, 3 both; synthetic: none and 3 alphas; two window sizes
    assert len(rows) == 2 * (12 + 12 + 4)
    assert {(r["source"], r["shift"]) for r in rows} >= {("digits", "covariate"), ("cifar-like", "both")}
    assert all(
        0 <= r["cover_plain"] <= 1 and r["cover_plain_ci"][0] <= r["cover_plain"] <= r["cover_plain_ci"][1]
        for r in rows
    )
    assert "not run" in tiny["cbpe"] and not any("mae_cbpe" in r for r in rows)
    met = {g["goal"]: g["met"] for g in tiny["goals"]}
    assert not any(v == "pending" for v in met.values())
    assert met["label shift alpha 0.1: MAE >= 30% lower than CBPE's"] == "not measured"
    assert all(isinstance(v, bool) for g, v in met.items() if g.startswith(("estimated accuracy: MAE", "EM priors")))
    page = render.markdown(
        {
            "machine": {
                "cores": 2,
                "cpu": "cpu",
                "isa": "x",
                "memory_gib": 1,
                "python": "3",
                "numpy": "2",
                "commit": "abc1234",
            },
            "wall_seconds": 1.0,
            **tiny,
        }
    )
    for section in (
        "## Goals",
        "## Estimated accuracy",
        "## Priors and adaptation",
        "## Adapted intervals that carry EM's error",
        "## Label-shift alarm",
        "## Sets under label shift",
        "## The digits intervals",
    ):
        assert section in page
    # no shift at three thresholds, three alphas, and the covariate pools of digits and cifar-like
    assert len(tiny["alarm"]) == 3 * 6 + 2 * 5
    assert {(r["source"], r["alpha"], r["rule"]) for r in tiny["sets"]} >= {
        ("digits", 0.1, "lac"),
        ("synthetic", 10.0, "aps"),
    }
    assert all("cover_carried" in r for r in rows if r["shift"] == "label")
    assert isinstance(next(v for g, v in met.items() if g.startswith("sets weighted by EM's priors")), bool)
    assert met["label-shift alarm: detection delay under label shift, against an oracle told the shift"] == "reported"
    assert "at commit `abc1234`" in page and "pending" not in page


def test_the_oracle_adaptation_lowers_the_nll_and_em_finds_the_window_priors():
    source = synthetic_source(SYNTHETIC, seed=3, rows=20_000)
    error = measure.reference_error(source, seed=0, resamples=50)
    row, _ = measure.measure_row(source, Scenario("label", alpha=1.0), n=1_000, streams=20, seed=5, error=error)
    assert row["nll_oracle"] < row["nll_plain"]
    assert row["nll_adapted"] < row["nll_plain"]
    # without adaptation the priors would be the source's, far from Dirichlet(1) draws; EM lands near the frequencies
    pool = source.pools["clean"]
    windows = draw_windows(pool, 1.0, 20, 1_000, seed=5)
    frequencies = np.array([np.bincount(pool.labels[i], minlength=5) / 1_000 for i in windows.index])
    source_l1 = np.abs(frequencies - source.true_priors).sum(axis=1).mean()
    assert row["em_l1"] < source_l1 / 3


def test_the_interval_holds_the_realized_accuracy_of_a_calibrated_source():
    """120 windows of 500 from the calibrated CIFAR-like source: the count of windows held is Binomial(120, >= 0.95)
    when the interval is right; it fails this check with probability below 0.001."""
    source = synthetic_source(CIFAR_LIKE, seed=1, rows=20_000)
    error = measure.reference_error(source, seed=0, resamples=50)
    row, _ = measure.measure_row(source, Scenario("none"), n=500, streams=120, seed=2, error=error)
    held = round(row["cover_plain"] * 120)
    assert held >= stats.binom.ppf(0.001, 120, 0.95)
    assert row["mae_plain"] < 0.03


def test_scenarios_follow_the_pools_a_source_has():
    source = synthetic_source(SYNTHETIC, seed=0, rows=1_000)
    assert [s.shift for s in scenarios(source)] == ["none", "label", "label", "label"]


def test_label_shift_windows_draw_their_class_counts_from_the_priors():
    source = synthetic_source(SYNTHETIC, seed=0, rows=5_000)
    pool = source.pools["clean"]
    windows = draw_windows(pool, 0.1, 50, 2_000, seed=0)
    frequencies = np.array([np.bincount(pool.labels[i], minlength=5) / 2_000 for i in windows.index])
    # multinomial sampling: the L1 distance of n = 2,000 draws from their priors is at most about 0.05
    assert np.abs(frequencies - windows.priors).sum(axis=1).mean() < 0.05
    again = draw_windows(pool, 0.1, 50, 2_000, seed=0)
    np.testing.assert_array_equal(windows.index, again.index)


def test_the_alarm_stays_silent_without_shift_and_the_oracle_raises_first_on_a_strong_one():
    """40 unshifted streams of 2,000 predictions at the default A: the bound allows 2,000 / 10^8 per stream plus
    epsilon = 0.01 for the reference's draw, and none raises. Under Dirichlet(0.1) priors every stream's means leave
    the band; the alarm raises on each within 2,000, and the oracle told the priors, the CUSUM of the exact
    likelihood ratio, raises first on the median."""
    source = synthetic_source(SYNTHETIC, seed=4, rows=20_000)
    config = LabelShiftAlarmConfig.for_reference(source.reference)
    pool = source.pools["clean"]
    quiet = draw_windows(pool, None, 40, 2_000, seed=6)
    assert np.all(alarm.first_raise(config, pool.probs, quiet.index) == -1)
    shifted = draw_windows(pool, 0.1, 40, 2_000, seed=7)
    ours = alarm.first_raise(config, pool.probs, shifted.index)
    oracle = alarm.oracle_raise(pool.probs, shifted.index, shifted.priors / source.true_priors, config.threshold)
    assert np.all(alarm.left_band(config, pool, shifted.priors))
    assert np.all(ours >= 0) and np.all(oracle >= 0)
    assert np.median(oracle) < np.median(ours)


def test_the_counted_sets_are_prediction_sets_and_weights_lift_coverage_toward_the_hard_class():
    """The sets the benchmark counts (all labels' scores at or below per-class thresholds) are ``prediction_sets``'
    for LAC and randomized APS. On the 5-class source, whose class 0 is the easy one, a shift toward class 4 lowers
    the unweighted sets' coverage; over 100 calibration splits of 500 fresh rows the sets weighted by the true
    ratios and by EM's cover more, the mean of the paired gains above 0 by more than 3.3 standard errors (a 99.95%
    one-sided bound)."""
    source = synthetic_source(SYNTHETIC, seed=3, rows=20_000)
    pool = source.pools["clean"]
    probs, labels = pool.probs[:10_000], pool.labels[:10_000]
    rng = np.random.default_rng(8)
    u = rng.random(len(labels))
    thresholds = np.array([0.3, 0.5, 0.6, 0.7, 0.8])
    for rule in ("lac", "aps"):
        counted = sets.all_scores(probs, rule, u) <= thresholds + sets.SCORE_ATOL
        served = prediction_sets(probs, thresholds, rule, u=u if rule == "aps" else None)
        np.testing.assert_array_equal(counted, served)
    target = np.array([0.01, 0.01, 0.01, 0.01, 0.96])
    spare_probs, spare_labels = pool.probs[10_000:], pool.labels[10_000:]
    scores = sets.all_scores(spare_probs, "lac", None)[np.arange(len(spare_labels)), spare_labels]
    true = sets.all_scores(probs, "lac", None)[np.arange(len(labels)), labels]
    per_class = np.bincount(labels, minlength=5)
    gains = []
    for _ in range(100):
        calibration = rng.choice(len(spare_labels), 500, replace=False)
        rows = np.concatenate([rng.choice(pool.by_class[c], n) for c, n in enumerate(rng.multinomial(2_000, target))])
        em = em_priors(pool.probs[rows], np.asarray(source.reference.mean_probabilities))
        covered = []
        for weights in (np.ones(5), target / source.true_priors, np.asarray(em.weights)):
            q = label_shift_quantiles(scores[calibration], spare_labels[calibration], weights, 0.1, 5)
            held = np.bincount(labels, weights=true <= q[labels] + sets.SCORE_ATOL, minlength=5) / per_class
            covered.append(target @ held)
        gains.append([covered[1] - covered[0], covered[2] - covered[0]])
    gains = np.array(gains)
    assert np.all(gains.mean(axis=0) - 3.3 * gains.std(axis=0, ddof=1) / np.sqrt(len(gains)) > 0)


def test_the_cost_goal_reads_the_median_ratio_against_the_rounds():
    def summary(median, low, high):
        return {
            "rows": 1,
            "rounds": 5,
            "median_ratio": median,
            "ratio_range": f"{low}-{high}",
            "low": low,
            "high": high,
            "spread": 1.1,
        }

    found = goals.cost_goals(
        {
            "off": {"summary": [summary(0.99, 0.97, 1.02)]},
            "always": {"summary": [summary(0.97, 0.9, 1.01)]},
            "worse": {"summary": [summary(0.8, 0.7, 0.9)]},
        }
    )
    assert [g["met"] for g in found] == ["yes", "within spread", "no"]
    assert "median ratio 0.800" in found[2]["worst"]
