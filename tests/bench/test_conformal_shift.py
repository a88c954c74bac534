"""The conformal benchmark's shift streams: the vectorized log tracker agrees with folding its state label by label,
and the rules it compares it with (ACI and the score-scale tracker, closed-form recursions of the miss counts) keep
their papers' deterministic long-run bounds. Fast: synthetic scores, no model."""

import math

import numpy as np
import pytest

from bench.conformal.shift import ALPHA, aci_rule, quantile_rule, run_log_tracker, run_rule
from calibkit.conformal import SplitConformal
from calibkit.conformal.adaptive import LogQuantileTracker, misses_of

ADVERSARIES = {
    # scores that flip between always missed and always covered, in long blocks
    "blocks": lambda rng, t: np.where((np.arange(t) // 500) % 2 == 0, 1.0, 0.0),
    "uniform": lambda rng, t: rng.uniform(size=t),
    "drift": lambda rng, t: np.clip(np.linspace(0.0, 1.0, t) + rng.normal(0, 0.1, t), 0, 1),
    "constant high": lambda rng, t: np.ones(t),
    "bounded switches": lambda rng, t: np.where(
        (np.arange(t) // 700) % 2 == 0, rng.uniform(0.8, 1.0, t), rng.uniform(0, 0.3, t)
    ),
}


def _calibrator(seed: int = 0) -> SplitConformal:
    rng = np.random.default_rng(seed)
    return SplitConformal.fit(rng.dirichlet(np.ones(5), 200), rng.integers(0, 5, 200), "lac")


@pytest.mark.parametrize("step", [0.005, 0.02, 0.05])
def test_aci_and_the_score_scale_tracker_keep_their_bounds_on_adversarial_sequences(step):
    """|M_t / t - alpha| <= (max(alpha, 1 - alpha) + gamma) / (gamma t) for ACI (Gibbs & Candès 2021, Prop. 4.1) and
    <= (B + eta) / (eta t) for the tracker with scores in [0, B = 1] (Angelopoulos et al. 2023, Prop. 1), at every t."""
    cal, t = _calibrator(), 3_000
    rng = np.random.default_rng(1)
    scores = np.stack([make(rng, t) for make in ADVERSARIES.values()])
    labels = np.arange(1, t + 1)
    for rule, bound in (
        (aci_rule(cal, step), (max(ALPHA, 1 - ALPHA) + step) / (step * labels)),
        (quantile_rule(cal, step), (1.0 + step) / (step * labels)),
    ):
        served, errs = run_rule(scores, rule)
        np.testing.assert_array_equal(errs, misses_of(scores, served))
        assert np.all(np.abs(np.cumsum(errs, axis=1) / labels - ALPHA) <= bound + 1e-12)


def test_aci_serves_the_full_set_to_a_reactive_adversary_only_as_its_bound_allows():
    """An adversary that misses whenever the set is not full: ACI's level falls to 0 and below, where the set is
    full; its misses stay within the bound."""
    cal, gamma, t = _calibrator(), 0.02, 2_000
    rule, misses, errs = aci_rule(cal, gamma), 0, []
    for i in range(t):
        err = 0 if rule(np.array([i]), np.array([misses]))[0] == math.inf else 1
        errs.append(err)
        misses += err
    labels = np.arange(1, t + 1)
    assert np.all(np.abs(np.cumsum(errs) / labels - ALPHA) <= (0.9 + gamma) / (gamma * labels) + 1e-12)


def test_the_rules_start_at_the_static_quantile():
    cal = _calibrator()
    zero = np.zeros(1, dtype=np.int64)
    assert aci_rule(cal, 0.01)(zero, zero)[0] == quantile_rule(cal, 0.02)(zero, zero)[0] == cal.quantile(ALPHA)


def test_the_vectorized_log_tracker_serves_what_its_state_serves():
    rng = np.random.default_rng(1)
    cal = SplitConformal.fit(rng.dirichlet(np.ones(4), 300), rng.integers(0, 4, 300), "lac")
    scores = np.clip(rng.uniform(0, 1, (3, 600)) ** 0.2 + np.linspace(0, 0.1, 600), 0, 1)
    served, errs = run_log_tracker(scores, cal, 0.1)
    for row in range(3):
        s = LogQuantileTracker.started(cal, ALPHA, 0.1)
        for t in range(scores.shape[1]):
            assert served[row, t] == s.threshold(cal)
            assert errs[row, t] == int(misses_of(scores[row, t], s.threshold(cal)))
            s = s.fold([scores[row, t]])
