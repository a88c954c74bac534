"""The conformal benchmark's shift streams run the rules of calibkit.adaptive_conformal: its vectorized runs agree
with folding the states label by label. Fast: synthetic scores, no model."""

import numpy as np

from bench.conformal.shift import ALPHA, aci_rule, quantile_rule, run_log_tracker, run_rule
from calibkit.adaptive_conformal import ACIState, LogQuantileTracker, QuantileTracker, misses_of
from calibkit.conformal import SplitConformal


def test_the_vectorized_rules_serve_what_the_states_serve():
    rng = np.random.default_rng(0)
    cal = SplitConformal.fit(rng.dirichlet(np.ones(4), 300), rng.integers(0, 4, 300), "lac")
    scores = np.clip(rng.uniform(0, 1, (3, 600)) + np.linspace(0, 0.4, 600), 0, 1)
    for rule, state in ((aci_rule(cal, 0.02), ACIState(ALPHA, 0.02)), (quantile_rule(cal, 0.03), None)):
        served, errs = run_rule(scores, rule)
        for row in range(3):
            s = state if state is not None else QuantileTracker.started(cal, ALPHA, 0.03)
            for t in range(scores.shape[1]):
                assert served[row, t] == s.threshold(cal)
                s = s.update(int(errs[row, t]))


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
