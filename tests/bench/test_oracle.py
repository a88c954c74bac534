"""bench.alarm.oracle: the family-blind clearing oracle learns which shift it is told of."""

import numpy as np

from bench.alarm import oracle


def _streams(rng, accuracy, streams, labels):
    c = rng.uniform(0.6, 0.95, (streams, labels))
    return c, (rng.random(c.shape) < accuracy(c)).astype(float)


def test_the_family_blind_clearing_oracle_learns_the_shift_and_then_clears_like_the_oracle():
    rng = np.random.default_rng(7)
    edges = np.linspace(0.6, 0.95, 36)[1:-1]
    centres = np.linspace(0.605, 0.945, 35)
    over = oracle.AccuracyCurve(edges, centres - 0.08)  # the shift: over-confident by 0.08
    under = oracle.AccuracyCurve(edges, np.minimum(centres + 0.04, 1.0))  # a member it is not
    shift_c, shift_y = _streams(rng, over, 300, 2_000)
    calm_c, calm_y = _streams(rng, lambda c: c, 300, 2_000)
    c, y = np.hstack([shift_c, calm_c]), np.hstack([shift_y, calm_y])

    told = oracle.cusum_paths(oracle.clearing_increments(c, y, over))
    blind = oracle.blind_clearing_paths(c, y, (over, under), (0.5, 1.0, 2.0))
    level = 8.0
    told_delay = oracle.unconditional_median(oracle.first_crossing(told, level, 2_000))
    blind_delay = oracle.unconditional_median(oracle.first_crossing(blind, level, 2_000))
    # told nothing but the six members, it pays for not knowing the size once the shift has ended: the calibrated
    # labels fit the half-size member best, so it clears later than the oracle, but not much later
    assert told_delay < blind_delay < 1.5 * told_delay
    # while the shift lasts it does not clear: the shift is one of the members
    assert (blind[:, :2_000].max(axis=1) >= level).mean() <= 0.01
    # told a family without the shift, it clears while the shift lasts: its level holds only for a member
    wrong = oracle.blind_clearing_paths(c, y, (under,), (1.0,))
    assert (wrong[:, :2_000].max(axis=1) >= level).mean() > 0.9
