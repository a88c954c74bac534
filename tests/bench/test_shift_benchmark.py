"""The shift benchmark (bench/shift): a tiny run has every row, goal and section, and says when CBPE did not run; on
seeded synthetic windows, the oracle's adaptation lowers the NLL under label shift, EM's priors land nearer the
window's class frequencies than the unadapted source priors, and the 95% Poisson-binomial interval holds the
realized accuracy of a calibrated source about 95% of the time (a binomial bound on the count)."""

import argparse

import numpy as np
import pytest
from scipy import stats

from bench.shift import goals, measure, render
from bench.shift.streams import (
    CIFAR_LIKE,
    SYNTHETIC,
    Scenario,
    draw_windows,
    scenarios,
    synthetic_source,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    missing = tmp_path_factory.mktemp("no-venv") / "python"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "REFS_PYTHON", missing)
        patch.setattr(measure, "ROOT", missing.parent.parent)
        args = argparse.Namespace(seed=0, pool_rows=5_000, windows=(100, 2_000), streams=3)
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
    assert sum(v == "pending" for v in met.values()) == len(goals.PENDING)
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
    for section in ("## Goals", "## Estimated accuracy", "## Priors and adaptation", "## The digits intervals"):
        assert section in page
    assert "at commit `abc1234`" in page and "pending" in page


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
