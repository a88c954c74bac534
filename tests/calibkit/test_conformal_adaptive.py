"""calibkit.conformal.adaptive: the log-scale tracker's deterministic long-run bound, its folds and JSON form, the
checks. (ACI's and the score-scale tracker's bounds are tested on the benchmark's recursions: tests/bench.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from calibkit.conformal import SplitConformal
from calibkit.conformal.adaptive import (
    DEFAULT_METHOD,
    DEFAULT_SPAN,
    DEFAULT_STEP,
    LogQuantileTracker,
    aci_thresholds,
    check_misses,
    log_scores,
    log_thresholds,
    served_ranked_sets,
    track,
)


def _calibrator(n: int = 200, seed: int = 0) -> SplitConformal:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(5), size=n)
    y = rng.integers(0, 5, n)
    return SplitConformal.fit(p, y, "lac")


ADVERSARIES = {
    # scores that flip between always missed and always covered, in long blocks
    "blocks": lambda rng, t: np.where((np.arange(t) // 500) % 2 == 0, 1.0, 0.0),
    "uniform": lambda rng, t: rng.uniform(size=t),
    "drift": lambda rng, t: np.clip(np.linspace(0.0, 1.0, t) + rng.normal(0, 0.1, t), 0, 1),
    "constant high": lambda rng, t: np.ones(t),
}


LOG_ADVERSARIES = {
    **ADVERSARIES,
    "all misses": lambda rng, t: np.ones(t),  # every score at the top of the range: missed unless the set is full
    "all covers": lambda rng, t: np.zeros(t),
    "alternating": lambda rng, t: (np.arange(t) % 2).astype(float),
    "over-confident": lambda rng, t: 1 - rng.uniform(size=t) ** 12,  # scores crowded just below the top
}


def _tracked(state: LogQuantileTracker, scores) -> tuple[LogQuantileTracker, np.ndarray]:
    """Fold the scores one at a time; the state after, and each label's miss at the level it was folded at."""
    errs = []
    for s in scores:
        errs.append(int(log_scores(s, state.span, state.score_range) > state.level))
        state = state.fold([s])
    return state, np.asarray(errs)


@pytest.mark.parametrize("name", sorted(LOG_ADVERSARIES))
@pytest.mark.parametrize("eta", [0.05, 0.1, 0.5])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.3])
def test_log_tracker_bound_holds_on_adversarial_sequences(name, eta, alpha):
    """The one-sided bound on the tracker's own misses, at every length; the level stays in [0, U + eta]."""
    cal = _calibrator()
    t = 3_000
    scores = LOG_ADVERSARIES[name](np.random.default_rng(6), t)
    state, errs = _tracked(LogQuantileTracker.started(cal, alpha, eta, span=6.0), scores)
    n = np.arange(1, t + 1)
    bound = (6.0 + eta) / (eta * n)
    assert np.all(np.cumsum(errs) / n - alpha <= bound + 1e-12)
    assert state.bound == pytest.approx(bound[-1]) and state.misses == errs.sum()
    assert 0.0 <= state.level <= 6.0 + (1 - alpha) * eta + 1e-12


def test_log_tracker_bound_against_a_reactive_adversary_whatever_the_score_range():
    """Scores at the top of [0, B = 3]: covered only by the full set; the bound does not depend on B."""
    alpha, eta, b = 0.1, 0.2, 3.0
    state, errs = _tracked(LogQuantileTracker(alpha, eta, 1.0, DEFAULT_SPAN, b), np.full(2_000, b))
    n = np.arange(1, len(errs) + 1)
    assert np.all(np.abs(np.cumsum(errs) / n - alpha) <= (DEFAULT_SPAN + eta) / (eta * n) + 1e-12)
    assert state.threshold() == math.inf or state.level >= DEFAULT_SPAN - eta


def test_log_thresholds_map_the_level_to_the_score_scale():
    x = np.array([-1e-9, 0.0, 0.5, 2.0, DEFAULT_SPAN - 1e-9, DEFAULT_SPAN, 20.0])
    q = log_thresholds(x, DEFAULT_SPAN, 2.0)
    assert q[0] == -math.inf and q[-1] == q[-2] == math.inf
    assert q[1:5].tolist() == (2.0 * -np.expm1(-x[1:5])).tolist()
    assert all(a <= b for a, b in zip(q[:-1], q[1:]))
    assert LogQuantileTracker(0.1, 0.1, 1.0, 1.0).threshold() == math.inf
    assert log_scores([0.0, 1.0, 2.0, 5.0], DEFAULT_SPAN, 2.0).tolist() == [
        0.0,
        math.log(2),
        DEFAULT_SPAN,
        DEFAULT_SPAN,
    ]


def test_log_tracker_does_not_wind_down_at_the_floor():
    """Anti-windup: labels the smallest sets already cover (score 0, the floor's top label) hold the level at 0, so
    that when the traffic then needs larger sets the level rises from 0 at once, as if the easy labels had not
    come; a tracker allowed below 0 would first climb back the whole way it wound down."""
    state = LogQuantileTracker(0.1, 0.1, 0.5, release=1.0).fold(np.zeros(5_000))
    assert state.level == state.served == 0.0 and state.threshold() == 0.0 and state.misses == 0
    assert LogQuantileTracker(0.1, 0.1, 0.5).fold(np.zeros(5_000)).served < 1e-4  # the average comes down too
    p = np.eye(3) * 0.7 + 0.1
    floor = SplitConformal.fit(p[[0, 1, 2, 0]], [0, 1, 2, 0], "aps", floor=True)
    assert state.sets(floor, p).sum(axis=1).tolist() == [1, 1, 1]  # the floor sets at level 0: the top label
    shifted = state.fold(np.full(20, 0.9))  # u = 2.3: missed until the level reaches it
    assert shifted.level == pytest.approx(20 * 0.1 * 0.9) and shifted.misses == 20
    unclamped = 0.5 + 0.1 * (0 - 5_000 * 0.1)  # the served-miss tracker's level after the same 5,000 labels
    assert unclamped < -49


def _served(scores: np.ndarray, delay: int, batch: int, fold) -> tuple[np.ndarray, np.ndarray]:
    """Serve label t's set at the state that has folded the labels that came back before it was served: those of
    predictions at least ``delay`` older, folded ``batch`` at a time. ``fold(state, scores, served_misses)`` is the
    rule; the served misses and the levels served."""
    state = fold(None, None, None)
    served_levels = np.empty(len(scores))
    misses = np.empty(len(scores), np.int64)
    folded = 0
    for t in range(len(scores)):
        back = max(0, t - delay) // batch * batch  # the labels back by now, in whole batches
        if back > folded:
            state = fold(state, scores[folded:back], misses[folded:back])
            folded = back
        served_levels[t] = state.served
        misses[t] = int(log_scores(scores[t], DEFAULT_SPAN, 1.0) > served_levels[t])
    return misses, served_levels


def test_label_delay_leaves_the_tracker_stable_and_the_served_sets_covering():
    """I.i.d. scores, labels 1,000 predictions late in batches of 200: fed each label's own score, the tracker's
    levels are those of no delay shifted in time, every window of 1,000 served sets covers at least the target less
    3 points, and all of them together at least the target less 1. Fed the misses of the sets served (the old
    loop), it overshoots to the full set and winds up."""
    alpha, eta, delay, batch = 0.1, DEFAULT_STEP, 1_000, 200
    scores = np.random.default_rng(12).beta(1.0, 6.0, 20_000)  # u = -log(1 - s): a stationary score law
    start = LogQuantileTracker(alpha, eta, float(log_scores(np.quantile(scores, 0.9), DEFAULT_SPAN, 1.0)))

    def own(state, s, _served):
        return start if state is None else state.fold(s)

    misses, levels = _served(scores, delay, batch, own)
    windows = misses[delay:].reshape(-1, 1_000).mean(axis=1)
    assert np.all(windows <= alpha + 0.03) and misses[delay:].mean() <= alpha + 0.01
    undelayed = start.fold(scores)
    assert undelayed.level == own(start, scores, None).level  # the levels depend on the scores alone

    class Naive:  # the served-miss loop: x = x_1 + eta (M - T alpha) over the misses of the sets served
        def __init__(self, level):
            self.level = self.served = level

    def naive(state, _s, served_misses):
        if state is None:
            return Naive(start.level)
        return Naive(state.level + eta * (int(served_misses.sum()) - len(served_misses) * alpha))

    naive_misses, naive_levels = _served(scores, delay, batch, naive)
    naive_windows = naive_misses[delay:].reshape(-1, 1_000).mean(axis=1)
    assert naive_windows.max() - naive_windows.min() > 0.2  # swings between empty-ish and full sets
    assert naive_levels.max() > DEFAULT_SPAN or naive_levels.min() < 0


def test_log_tracker_follows_a_seeded_shift_over_many_streams_bit_for_bit_with_one():
    """Calibrated traffic, then over-confident (temperature / 2.5), over 200 streams folded together by ``track``:
    each stream keeps its bound, coverage returns to target after the shift, and a stream folded alone by the
    state gives the same level to the bit."""
    rng = np.random.default_rng(8)
    streams, before, after, k, alpha, eta = 200, 500, 2_500, 10, 0.1, 0.1

    def draw(n: int, scale: float):
        z = rng.normal(size=(streams, n, k)) * 2.0
        y = np.argmax(z + rng.gumbel(size=z.shape), axis=-1)
        p = np.exp(scale * z - (scale * z).max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return 1.0 - np.take_along_axis(p, y[..., None], -1)[..., 0]

    cal_scores = draw(1, 1.0).ravel()
    cal = SplitConformal.fit(np.c_[1 - cal_scores, cal_scores], np.zeros(streams, int), "lac")
    scores = np.concatenate([draw(before, 1.0), draw(after, 2.5)], axis=1)
    first = LogQuantileTracker.started(cal, alpha, eta)
    settings = (alpha, eta, first.span, first.score_range, first.release)
    levels, smooth = np.full(streams, first.level), np.full(streams, first.level)
    errs = np.empty(scores.shape, np.int64)
    for t in range(scores.shape[1]):
        errs[:, t] = log_scores(scores[:, t], first.span, first.score_range) > levels
        levels, smooth, _ = track(levels, smooth, scores[:, t : t + 1], *settings)
    start = np.full(streams, first.level)
    together, together_smooth, misses = track(start, start, scores, *settings)
    assert together.tolist() == levels.tolist() and together_smooth.tolist() == smooth.tolist()
    assert misses.tolist() == errs.sum(axis=1).tolist()
    total = scores.shape[1]
    assert np.all(misses / total - alpha <= (first.span + eta) / (eta * total))
    assert abs(1 - errs[:, -after // 2 :].mean() - (1 - alpha)) <= 0.01
    one = first.fold(scores[0])
    assert one.level == levels[0] and one.smooth == smooth[0] and one.misses == misses[0]
    assert one.bound == (first.span + eta) / (eta * total)


def test_aci_thresholds_match_the_static_quantile():
    cal = _calibrator(n=99)
    levels = np.concatenate([np.linspace(0.001, 0.999, 997), [0.1, 0.05, 0.2, 1 / 100, 0.059]])
    expected = [cal.quantile(a) for a in levels]
    assert aci_thresholds(cal.scores, levels).tolist() == expected
    assert aci_thresholds(cal.scores, [0.0, -0.3, 1.0, 1.2]).tolist() == [math.inf, math.inf, -math.inf, -math.inf]


def test_the_served_ranked_sets_are_the_states_sets():
    """``served_ranked_sets`` lists what a state's ``sets`` serve, the full set from the span on included, for every
    score, randomized or not; at -inf (no tracker serves it) the sets are empty, but a floor calibrator's."""
    rng = np.random.default_rng(3)
    p, y = rng.dirichlet(np.ones(4), 100), rng.integers(0, 4, 100)
    draws = rng.uniform(size=20)
    for method, params in (("lac", {}), ("aps", {}), ("raps", {"k_reg": 1, "lam": 0.1})):
        for randomized in (False, True) if method != "lac" else (False,):
            cal = SplitConformal.fit(p, y, method, u=rng if randomized else None, **params)
            u = draws if randomized else None
            started = LogQuantileTracker.started(cal, 0.2, 0.3)
            full = LogQuantileTracker(0.2, 0.3, DEFAULT_SPAN, score_range=started.score_range)
            for state in (started, full, started.fold(np.zeros(50)), started.fold(np.full(20, 1e9))):
                order, sizes = served_ranked_sets(cal, p[:20], state.threshold(cal), u=u)
                listed = np.zeros((20, 4), dtype=bool)
                np.put_along_axis(listed, order, np.arange(4) < sizes[:, None], axis=1)
                assert listed.tolist() == state.sets(cal, p[:20], u=u).tolist()
            assert full.sets(cal, p[:20], u=u).all()
            _, sizes = served_ranked_sets(cal, p[:20], -math.inf, u=u)
            assert (sizes == 0).all()
    floor = SplitConformal.fit(p, y, "raps", k_reg=1, lam=0.1, floor=True)
    assert (served_ranked_sets(floor, p[:20], -math.inf)[1] >= 1).all()


def test_the_log_tracker_folds_in_chunks_as_at_once():
    scores = np.random.default_rng(4).beta(0.5, 2.0, 1_001) * 1.3
    make = lambda: LogQuantileTracker(0.07, 0.123, 1.8137, 7.5, 1.3)  # noqa: E731
    whole, chunked = make().fold(scores), make()
    for part in np.array_split(scores, [1, 2, 50, 333, 334, 900]):
        chunked = chunked.fold(part)
    assert whole == chunked and whole.level == chunked.level and whole.labels == 1_001


def test_to_dict_round_trips_exactly_through_json():
    state = LogQuantileTracker(0.1, 1 / 7, 0.1 + 0.2, DEFAULT_SPAN, 1 + 0.1 / 3)
    state = state.fold(np.random.default_rng(5).random(777) * (1 + 0.1 / 3))
    back = LogQuantileTracker.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.level == state.level and back.smooth == state.smooth
    assert type(back) is LogQuantileTracker


def test_from_dict_refuses_another_method_or_format():
    log = LogQuantileTracker(0.1, 0.1, 1.0).to_dict()
    for broken in (
        {**log, "method": "aci"},  # a state of a rule the service no longer serves
        {**log, "format": 1},
        {**log, "extra": 1},
        {k: v for k, v in log.items() if k != "span"},
    ):
        with pytest.raises(ValueError, match="`data`"):
            LogQuantileTracker.from_dict(broken)


def test_start_and_defaults():
    cal = _calibrator()
    assert DEFAULT_METHOD == "log-quantile"
    log = LogQuantileTracker.started(cal, 0.1, DEFAULT_STEP)
    assert log.eta == DEFAULT_STEP and log.span == DEFAULT_SPAN
    assert log.threshold(cal) == pytest.approx(cal.quantile(0.1), abs=1e-12)
    # the default step's bound promises the benchmark's long-run goal (1 point) at 10,000 labels on any sequence
    assert LogQuantileTracker(0.1, DEFAULT_STEP, 1.0, labels=10_000).bound <= 0.01


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: LogQuantileTracker(0.0, 0.1, 1.0), "alpha"),
        (lambda: LogQuantileTracker(1.5, 0.1, 1.0), "alpha"),
        (lambda: LogQuantileTracker(float("nan"), 0.1, 1.0), "alpha"),
        (lambda: LogQuantileTracker("0.1", 0.1, 1.0), "alpha"),  # type: ignore[arg-type]
        (lambda: LogQuantileTracker(0.1, math.inf, 1.0), "eta"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, labels=-1), "labels"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, labels=2, misses=3), "misses"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, labels=2.0), "labels"),  # type: ignore[arg-type]
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, release=0.5), "release"),
        (lambda: LogQuantileTracker.started("cal", 0.1, 0.1), "calibrator"),  # type: ignore[arg-type]
        (lambda: check_misses([0, 2]), "errs"),
        (lambda: check_misses([0.5]), "errs"),
        (lambda: check_misses([[0, 1]]), "errs"),
        (lambda: check_misses(["a"]), "errs"),
        (lambda: LogQuantileTracker(0.1, 0.0, 1.0), "eta"),
        (lambda: LogQuantileTracker(0.1, 0.1, -0.5), "start"),
        (lambda: LogQuantileTracker(0.1, 0.1, 5.0, span=4.0), "start"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, span=0.0), "span"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, score_range=math.nan), "score_range"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0).fold([-0.5]), "scores"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0).fold([math.nan]), "scores"),
        (lambda: LogQuantileTracker(0.1, 0.1, 1.0, level=-1.0), "level"),
        (lambda: aci_thresholds([0.3, 0.1], 0.1), "sorted_scores"),
        (lambda: aci_thresholds([0.1, 0.3], math.nan), "levels"),
    ],
)
def test_bad_arguments_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()
