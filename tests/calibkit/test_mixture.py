"""The alarms' mixture: scipy's log-sum-exp, and the shortcut that sums only the streams that can cross."""

import numpy as np

from calibkit.mixture import crosses, log_mixture


def test_the_mixture_is_the_weighted_sum_and_crossing_skips_no_stream_that_crosses():
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(6))
    for _ in range(200):
        log_s = rng.normal(0.0, 3.0, (50, 6))
        np.testing.assert_allclose(log_mixture(log_s, np.log(w)), np.log(np.exp(log_s) @ w), rtol=1e-12)
        level = float(rng.normal(2.0, 2.0))
        among = rng.random(50) < 0.7
        expected = among & (np.log(np.exp(log_s) @ w) >= level)
        np.testing.assert_array_equal(crosses(log_s, np.log(w), level, among), expected)
    assert not crosses(np.zeros((3, 6)), np.log(w), 0.1, np.ones(3, bool)).any()  # below: nothing summed
