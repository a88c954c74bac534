"""The conformal benchmark's reference law, its set-size bins and its goal rules. Fast: no model, no splits of
the benchmark's size."""

import numpy as np
import pytest

from bench.conformal.goals import goals
from bench.conformal.measure import exact_law, exact_mean, law_test, size_bins
from bench.conformal.serving import summarize
from calibkit.conformal import conformal_quantile


def _covered_counts(splits: int, n: int, m: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Split conformal on i.i.d. uniform scores: covered test labels per split."""
    scores = rng.uniform(size=(splits, n + m))
    q = np.array([conformal_quantile(row[:n], alpha) for row in scores])
    return (scores[:, n:] <= q[:, None]).sum(axis=1)


def test_the_exact_law_is_the_beta_binomial_of_split_conformal():
    n, m, alpha = 19, 40, 0.1  # l = floor(20 * 0.1) = 2: coverage ~ Beta(18, 2), mean 0.9
    law = exact_law(n, m, alpha)
    assert law.mean() / m == pytest.approx(exact_mean(n, alpha)) == pytest.approx(0.9)
    assert law.var() / m**2 > 18 * 2 / (20**2 * 21)  # the Beta's variance plus the test labels' sampling
    counts = _covered_counts(2_000, n, m, alpha, np.random.default_rng(0))
    assert counts.mean() / m == pytest.approx(0.9, abs=0.005)
    _, p = law_test(counts, n, m, alpha, np.random.default_rng(1))
    assert p > 0.01


def test_the_law_test_rejects_coverage_without_the_calibration_noise():
    n, m, alpha = 19, 40, 0.1
    rng = np.random.default_rng(2)
    binomial = rng.binomial(m, 0.9, size=2_000)  # right mean, too little spread: coverage fixed at 0.9
    _, p = law_test(binomial, n, m, alpha, rng)
    assert p < 1e-6
    with pytest.raises(ValueError, match="alpha"):
        exact_law(5, m, 0.1)  # ceil(6 * 0.9) = 6 > 5: no finite threshold


def test_size_bins_start_with_sizes_0_and_1_and_hold_enough_labels():
    labels = np.array([30, 50, 60, 70, 0, 20, 5])  # sizes 0..6
    covered = np.array([0, 45, 55, 60, 0, 19, 5])
    bins = size_bins(labels, covered, min_labels=100)
    # 0-1 (80) takes 2 to reach 100 labels; 3 (70) takes 5 and 6 (size 4 has none) but holds 95: it joins 0-2
    assert [(b["sizes"], b["labels"], b["covered"]) for b in bins] == [("0-6", 235, 184)]
    bins = size_bins(labels, covered, min_labels=60)
    assert [(b["sizes"], b["labels"]) for b in bins] == [("0-1", 80), ("2", 60), ("3-6", 95)]
    assert bins[-1]["coverage"] == pytest.approx(84 / 95)
    # sizes 0 and 1 share a bin even when each alone is enough
    assert size_bins(np.array([200, 300]), np.array([0, 280]))[0]["sizes"] == "0-1"
    assert size_bins(np.array([0, 300, 150]), np.array([0, 280, 140]))[0]["sizes"] == "1"


def _result(raps_size: float, worst_bin: float) -> dict:
    exchangeable, bins = [], []
    for method, randomized in (("LAC", False), ("APS randomized", True), ("RAPS randomized", True)):
        size = raps_size if method.startswith("RAPS") else 2.0
        exchangeable.append(
            {
                "data": "d",
                "alpha": 0.1,
                "method": method,
                "randomized": randomized,
                "excess": 0.001,
                "coverage_se": 0.001,
                "ks_d": 0.02,
                "ks_p": 0.5,
                "size": size,
            }
        )
        coverage = worst_bin if method == "APS randomized" else 0.9
        bins += [
            {"data": "d", "alpha": 0.1, "method": method, "sizes": "0-1", "labels": 500, "coverage": coverage},
            {"data": "d", "alpha": 0.1, "method": method, "sizes": "2", "labels": 100, "coverage": 0.92},
        ]
    exchangeable.append({**exchangeable[1], "method": "APS non-randomized", "randomized": False, "excess": 0.05})
    classes = [
        {"data": "d", "alpha": 0.1, "method": "LAC", "sets": sets, "worst_class": 3, "worst_coverage": 0.8}
        for sets in ("marginal", "mondrian")
    ]
    cost = [
        {"classes": k, "op": op, "method": "LAC", "median_ms": ms, "mean_set_size": 37.5}
        for k, ms in ((1_000, 0.4), (10, 0.05))
        for op in ("served", "listed", "sets", "p_values")
    ]
    return {
        "setup": {"min_bin_labels": 100},
        "exchangeable": exchangeable,
        "bins": bins,
        "classes": classes,
        "cost": cost,
    }


def _goal(judged: list[dict], start: str) -> dict:
    return next(g for g in judged if g["goal"].startswith(start))


def test_goals_judge_raps_against_aps_and_the_worst_bin_and_list_what_is_not_measured():
    judged = goals(_result(1.9, 0.86))
    for start in (
        "RAPS",
        "coverage by set size",
        "exchangeable: mean coverage",
        "exchangeable: per-split",
        "cost: sets",
    ):
        assert _goal(judged, start)["met"] is True, start
    assert _goal(judged, "exchangeable: non-randomized")["met"] == "reported"
    judged = goals(_result(2.1, 0.84))
    assert _goal(judged, "RAPS")["met"] is False and "(1.050x)" in _goal(judged, "RAPS")["worst"]
    assert _goal(judged, "coverage by set size")["met"] is False
    assert "0.840 at sizes 0-1" in _goal(judged, "coverage by set size")["worst"]
    pending = [g for g in judged if g["met"] == "not yet measured"]
    assert len(pending) == 7 and all(g["worst"].startswith("needs ") for g in pending)


def test_the_cost_goal_judges_the_served_sets_and_the_masks_and_reports_the_listing():
    """At 1,000 classes both the service's ranked sets and the masks must be within the bound; the lists for the
    responses, as long as the sets, are reported with their set size."""
    result = _result(1.9, 0.86)
    assert _goal(goals(result), "cost: sets")["met"] is True
    for row in result["cost"]:
        if row["classes"] == 1_000 and row["op"] in ("served", "listed"):
            row["median_ms"] = 0.6
    judged = goals(result)
    assert _goal(judged, "cost: sets")["met"] is False
    assert _goal(judged, "cost: sets")["worst"] == "0.600 ms, served LAC (1 of 2 met)"
    listed = _goal(judged, "cost: the served sets")
    assert listed["met"] == "reported" and listed["worst"].startswith("0.600 ms, LAC, mean set size 37.5")


def _serving(ratios: dict[int, list[float]], sets_cpu: dict[int, float]) -> dict:
    rounds = [
        {"rows": rows, "round": i + 1, "seconds": 5.0, "with_rows_per_s": 1_000 * r, "without_rows_per_s": 1_000.0}
        | {"ratio": r, "cpu_ratio": r, "without_cpu_us_per_row": 60.0}
        | {"with_batch_rows": 24.0, "without_batch_rows": 16.0}
        for rows, values in ratios.items()
        for i, r in enumerate(values)
    ]
    summary = summarize(rounds)
    assert all(s["batch_rows"] == 16.0 for s in summary)  # the smaller batch, dearer per row
    for s in summary:
        s |= {"cost_batch_rows": 16, "sets_cpu_us_per_row": sets_cpu[s["rows"]], "path_cpu_us_per_row": 3.0}
        s["cost_ratio"] = s["without_cpu_us_per_row"] / (s["without_cpu_us_per_row"] + s["sets_cpu_us_per_row"])
    return {"clients": 64, "sets": {}, "rounds": rounds, "summary": summary}


def test_the_serving_goal_judges_the_sets_own_cpu_at_every_request_size_and_p_values_are_reported():
    judged = goals(_result(1.9, 0.86))
    assert _goal(judged, "cost: p-values")["met"] == "reported"
    assert _goal(judged, "sets on the light model")["met"] == "not yet measured"
    # rows/s rounds that swing below the goal do not decide it: the sets' own CPU does
    noisy = {1: [0.97, 0.80, 0.99], 8: [0.96, 0.98, 1.01]}
    judged = goals(_result(1.9, 0.86) | {"serving": _serving(noisy, {1: 1.0, 8: 3.0})})
    serving = _goal(judged, "sets on the light model")
    assert serving["met"] is True and serving["rows"] == 6
    assert (
        serving["worst"].startswith("0.952 at 8-row") and "rows/s ratio 0.970, rounds 0.800-0.990" in serving["worst"]
    )
    assert len([g for g in judged if g["met"] == "not yet measured"]) == 6
    judged = goals(_result(1.9, 0.86) | {"serving": _serving(noisy, {1: 1.0, 8: 4.4})})
    assert _goal(judged, "sets on the light model")["met"] is False
    assert _goal(judged, "sets on the light model")["worst"].startswith("0.932 at 8-row")
