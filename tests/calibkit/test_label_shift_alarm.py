"""calibkit.label_shift_alarm: false alarms at the least favourable null and on unshifted traffic, detection of a
prior change against oracles, clearing and hysteresis, folds, JSON forms and input checks."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from calibkit.eprocess import threshold_for
from calibkit.label_shift_alarm import (
    DEFAULT_PREDICTIONS,
    DEFAULT_RATE,
    DEFAULT_THRESHOLD,
    LabelShiftAlarmConfig,
    LabelShiftAlarmState,
)
from calibkit.manifest import LabelShiftReference
from calibkit.reference_margins import reference_tolerance
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

K = 10
N_REFERENCE = 359  # the digits validation split's rows


@functools.lru_cache(maxsize=1)
def _pool() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits-like calibrated traffic: 10 classes, labels drawn from softmax(z) (accuracy near 0.9), rows sorted
    by label; returns (probabilities, first row of each label, rows of each label, M[k, y] = E[p_k | y])."""
    z, y = calibrated_logits(60_000, K, 10.0, seed=0)
    order = np.argsort(y, kind="stable")
    p, y = softmax(z)[order], y[order]
    counts = np.bincount(y, minlength=K)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    m = np.stack([p[y == k].mean(axis=0) for k in range(K)], axis=1)
    return p, starts, counts, m


def _source_priors() -> np.ndarray:
    _, _, counts, _ = _pool()
    return counts / counts.sum()


def _traffic(rng: np.random.Generator, priors: np.ndarray, n: int) -> np.ndarray:
    """(streams, n, K) served probabilities, stream s label-shifted to ``priors[s]`` by resampling the pool."""
    p, starts, counts, _ = _pool()
    u = rng.random((len(priors), n, 1))
    labels = np.minimum((u > np.cumsum(priors, axis=1)[:, None, :]).sum(axis=2), K - 1)
    rows = starts[labels] + (rng.random(labels.shape) * counts[labels]).astype(np.int64)
    return p[rows]


def _reference(rng: np.random.Generator, n: int = N_REFERENCE) -> tuple[float, ...]:
    """q: the mean probabilities of n validation rows, as the manifest stores them."""
    p, _, _, _ = _pool()
    mean = p[rng.choice(len(p), n, replace=False)].mean(axis=0)
    return tuple((mean / mean.sum()).tolist())


def _boundary_traffic(rng: np.random.Generator, mean, concentration: float, shape) -> np.ndarray:
    """Probability vectors from Dirichlet(concentration * mean): every class's conditional mean is ``mean``."""
    return rng.dirichlet(concentration * np.asarray(mean), size=shape)


def _binomial_high(n: int, p: float, alpha: float = 1e-3) -> float:
    """The largest count Binomial(n, p) exceeds with probability at most alpha."""
    return float(stats.binom.ppf(1 - alpha, n, min(p, 1.0)))


def _raising_trajectory(config: LabelShiftAlarmConfig, probs: np.ndarray) -> np.ndarray:
    """(streams, n) log M_t of the raising mixture, never reset: an independent recomputation from the e-values."""
    log_e = config.log_e_values(probs)  # (streams, n, D)
    log_s = np.zeros((probs.shape[0], log_e.shape[2]))
    out = np.empty(probs.shape[:2])
    for t in range(probs.shape[1]):
        log_s = np.maximum(log_s, 0.0) + log_e[:, t]
        out[:, t] = logsumexp(log_s + config.log_weights, axis=1)
    return out


def test_e_values_have_mean_one_on_the_edges_and_stay_positive():
    """Waudby-Smith & Ramdas's betting e-values: E[e] = 1 exactly when the class mean sits on its edge, for every
    bet; and e >= 1 - f > 0 for any probability vector."""
    config = LabelShiftAlarmConfig(reference=(0.2,) * 5, tolerance=0.05)
    mean = (0.25, 0.2, 0.2, 0.2, 0.15)  # class 0 on its upper edge, class 4 on its lower edge
    p = _boundary_traffic(np.random.default_rng(0), mean, 0.5, 200_000)
    e = np.exp(config.log_e_values(p)).reshape(len(p), 2, 5, -1)
    means, errors = e.mean(axis=0), e.std(axis=0) / np.sqrt(len(p))
    for side, k in ((0, 0), (1, 4)):
        assert np.all(np.abs(means[side, k] - 1.0) <= 4 * errors[side, k] + 1e-12)
    assert np.all(means[0, 1:4] < 1.0) and np.all(means[1, 0:4] < 1.0)  # the classes inside: e below 1 on average
    assert e.min() >= 1 - max(config.fractions) - 1e-12
    clear = np.exp(config.log_e_values(p, clearing=True)).reshape(len(p), 2, 5, -1)
    for side, k in ((0, 0), (1, 4)):  # the reverse null holds on the edge too
        assert np.all(
            np.abs(clear.mean(axis=0)[side, k] - 1.0) <= 4 * clear.std(axis=0)[side, k] / np.sqrt(len(p)) + 1e-12
        )


@pytest.mark.parametrize("concentration", [0.1, 3.0])
def test_false_alarms_at_the_least_favourable_null_stay_within_n_over_a(concentration):
    """Seeded: 2,000 streams whose class 0 mean sits on its upper edge and class 4's on its lower one, as one-hot-like
    (0.1) or diffuse (3) Dirichlet vectors. With A = 200 and n = 100 the bound n / A is 1/2 per stream; the count of
    streams that raise must stay under the Binomial(2,000, 1/2) 99.9% point (the bound is loose: an e-detector of
    small increments runs far longer than A at the null). Streams with class 0's mean 0.25 beyond the edge (a fifth as
    many: each raise restarts the fold's vectorised sums) raise in most streams within the same n, so the test would
    see an alarm that raised freely."""
    config = LabelShiftAlarmConfig(reference=(0.2,) * 5, tolerance=0.05, threshold=200.0)
    rng = np.random.default_rng(int(concentration * 10))
    streams, n = 2_000, 100
    at_edge = LabelShiftAlarmState.fresh(config, streams).fold(
        _boundary_traffic(rng, (0.25, 0.2, 0.2, 0.2, 0.15), concentration, (streams, n))
    )
    assert at_edge.alarmed.sum() <= _binomial_high(streams, n / config.threshold)
    beyond = LabelShiftAlarmState.fresh(config, streams // 5).fold(
        _boundary_traffic(rng, (0.5, 0.2, 0.1, 0.1, 0.1), concentration, (streams // 5, n))
    )
    assert beyond.alarmed.mean() > 0.5
    assert beyond.alarmed.mean() > 5 * max(at_edge.alarmed.mean(), 1 / streams)


def test_unshifted_traffic_does_not_raise_with_the_reference_margins():
    """Seeded: 10 validation draws of 359 rows, 20 streams of 2,000 unshifted predictions each (200 in all). With the
    reference's margins and the tolerance no stream raises, at the default A nor at A = 1,000; without margins or
    tolerance most streams raise at A = 1,000: the estimated reference differs from the traffic's means, and an
    e-detector finds any fixed difference in the end."""
    rng = np.random.default_rng(1)
    raised = {"default": 0, "A=1e3": 0, "exact A=1e3": 0}
    for _ in range(10):
        q = _reference(rng)
        probs = _traffic(rng, np.tile(_source_priors(), (20, 1)), 2_000)
        configs = {
            "default": LabelShiftAlarmConfig(reference=q, n_reference=N_REFERENCE),
            "A=1e3": LabelShiftAlarmConfig(reference=q, n_reference=N_REFERENCE, threshold=1e3),
            "exact A=1e3": LabelShiftAlarmConfig(reference=q, tolerance=0.0, threshold=1e3),
        }
        for name, config in configs.items():
            raised[name] += int(LabelShiftAlarmState.fresh(config, 20).fold(probs).alarmed.sum())
    assert raised["default"] == 0
    assert raised["A=1e3"] == 0
    assert raised["exact A=1e3"] > 100


def test_a_dirichlet_prior_change_is_detected_and_its_delay_compared_with_oracles():
    """Seeded: 8 validation draws x 16 streams whose priors jump at the start to Dirichlet(1) draws. Every stream
    that moves some class's mean more than 0.05 beyond its band raises within 3,000 predictions, at the default
    A. Oracles at the same A: the CUSUM of the exact likelihood ratio sum_y w_y p_ty (w = pi_t / pi_s, the shift
    told in full, no tolerance) is far faster; a CUSUM told the moved class, its side and its new mean, betting
    Kelly's fraction against the same edge, is slower than the mixture by its log-cost only."""
    rng = np.random.default_rng(2)
    _, _, _, m = _pool()
    pi_s = _source_priors()
    ours, full, told = [], [], []
    level = np.log(DEFAULT_THRESHOLD)
    for _ in range(8):
        config = LabelShiftAlarmConfig(reference=_reference(rng), n_reference=N_REFERENCE)
        priors = rng.dirichlet(np.ones(K), size=16)
        probs = _traffic(rng, priors, 3_000)
        state = LabelShiftAlarmState.fresh(config, 16).fold(probs)
        means = priors @ m.T  # E_t[p_k]
        excess = np.stack([means - config.upper, config.lower - means])  # (2, streams, K)
        for s in range(16):
            side, k = np.unravel_index(np.argmax(excess[:, s]), (2, K))
            if excess[side, s, k] <= 0.05:
                continue
            log_lr = np.log(probs[s] @ (priors[s] / pi_s))
            edge, mu = (config.upper[k], means[s, k]) if side == 0 else (config.lower[k], means[s, k])
            gap = (probs[s, :, k] - edge) * (1 if side == 0 else -1)
            bet = min(abs(mu - edge) / (edge * (1 - edge)), 0.99 / (edge if side == 0 else 1 - edge))
            ours.append(state.raised_at[s])
            full.append(_first_crossing(log_lr, level))
            told.append(_first_crossing(np.log1p(bet * gap), level))
    ours_, full_, told_ = np.array(ours), np.array(full), np.array(told)
    assert len(ours_) >= 50
    assert np.all(ours_ >= 0) and np.all(full_ >= 0) and np.all(told_ >= 0)
    assert np.median(ours_) < 2_000
    assert np.median(full_) * 3 < np.median(ours_)
    assert np.median(told_) < np.median(ours_) < 2 * np.median(told_)


def _first_crossing(log_e: np.ndarray, level: float) -> int:
    log_s = 0.0
    for t, x in enumerate(log_e):
        log_s = max(log_s, 0.0) + x
        if log_s >= level:
            return t
    return -1


def test_the_alarm_holds_on_the_edge_and_clears_when_the_shift_ends():
    """Seeded, 100 streams of 5 classes, reference (0.2, ...), tolerance 0.05, A = B = 10^4: class 0's mean at 0.45
    for 300 predictions raises every stream; then 3,000 predictions exactly on its edge (0.25): the reverse null
    holds, P(a clear) <= n / B = 0.3 per stream, and few clear; a statistic compared with A alone, raised at A and
    dropped below it, flips many times per stream there; then the reference's traffic clears every stream."""
    config = LabelShiftAlarmConfig(reference=(0.2,) * 5, tolerance=0.05, threshold=1e4, clear_threshold=1e4)
    rng = np.random.default_rng(3)
    streams = 100
    shifted = _boundary_traffic(rng, (0.45, 0.15, 0.15, 0.15, 0.1), 2.0, (streams, 300))
    edge = _boundary_traffic(rng, (0.25, 0.2, 0.2, 0.2, 0.15), 2.0, (streams, 3_000))
    back = _boundary_traffic(rng, (0.2,) * 5, 2.0, (streams, 3_000))
    state = LabelShiftAlarmState.fresh(config, streams).fold(shifted)
    assert state.alarmed.all() and np.all(state.raises == 1)
    assert np.all(state.side_statistics[:, 0, 0] >= state.side_statistics.max(axis=(1, 2)))  # class 0, up drives it
    state = state.fold(edge)
    assert (state.cleared_at >= 0).sum() <= _binomial_high(streams, 3_000 / config.clear_threshold)
    assert state.raises.max() <= 2
    naive = (
        _raising_trajectory(config, np.concatenate([shifted, edge], axis=1))[:, 300:] >= config.process.log_threshold
    )
    flips = np.abs(np.diff(naive.astype(int), axis=1)).sum(axis=1)
    assert np.mean(flips) > 5 * np.mean(state.raises + (state.cleared_at >= 0))
    state = state.fold(back)
    assert not state.alarmed.any()
    delay = state.cleared_at - 3_300
    assert np.all(delay >= 0) and np.median(delay) < 2_000


def test_clearing_waits_for_min_clear_and_a_clear_restarts_the_raising_detectors():
    config = LabelShiftAlarmConfig(
        reference=(0.5, 0.3, 0.2), tolerance=0.05, threshold=100.0, clear_threshold=100.0, min_clear=500
    )
    state = LabelShiftAlarmState.fresh(config).fold([[0.1, 0.1, 0.8]] * 20 + [[0.5, 0.3, 0.2]] * 600)
    raised = int(state.raised_at[0])
    assert int(state.cleared_at[0]) == raised + 500
    assert np.all(state.log_statistic[0] <= state.log_statistic[0].max())
    assert state.summary()["since"] == 620 - (raised + 500) - 1
    state = state.fold([[0.1, 0.1, 0.8]] * 30)
    assert int(state.raises[0]) == 2 and bool(state.alarmed[0])


def test_the_summary_names_the_class_that_moved():
    q = (0.4, 0.3, 0.2, 0.1)
    config = LabelShiftAlarmConfig(reference=q, n_reference=500, threshold=1e4)
    rng = np.random.default_rng(4)
    state = LabelShiftAlarmState.fresh(config).fold(_boundary_traffic(rng, q, 1.0, 3_000))
    state = state.fold(_boundary_traffic(rng, (0.2, 0.3, 0.2, 0.3), 1.0, 2_000))  # class 3 up, class 0 down
    summary = state.summary()
    assert summary["alarmed"] and summary["driver"]["class"] in (0, 3)
    rows = summary["classes"]
    assert [r["reference"] for r in rows] == list(q)
    assert rows[3]["recent_mean"] > rows[3]["upper"] and rows[0]["recent_mean"] < rows[0]["lower"]
    assert abs(rows[3]["mean_since"] - 0.3) < 0.05
    assert rows[0]["down"] > 1 and rows[3]["up"] > 1
    assert json.loads(json.dumps(summary)) == summary


def test_folding_in_chunks_equals_folding_at_once():
    """Through raises and clears, with chunks that cross the e-values' blocks and empty ones: the same decisions at
    the same predictions, the same counts and means bit for bit, the statistics to rounding (a stretch without an
    alarm is folded by cumulative sums, whose rounding depends on where the stretch starts)."""
    config = LabelShiftAlarmConfig(
        reference=(0.5, 0.3, 0.2), n_reference=400, threshold=200.0, clear_threshold=200.0, half_life=50.0
    )
    rng = np.random.default_rng(5)
    probs = np.concatenate(
        [
            _boundary_traffic(rng, (0.5, 0.3, 0.2), 1.0, (7, 400)),
            _boundary_traffic(rng, (0.2, 0.3, 0.5), 1.0, (7, 300)),
            _boundary_traffic(rng, (0.5, 0.3, 0.2), 1.0, (7, 2_301)),
        ],
        axis=1,
    )
    whole = LabelShiftAlarmState.fresh(config, 7).fold(probs)
    assert np.all(whole.raises >= 1) and np.all(whole.cleared_at >= 0)
    chunked = LabelShiftAlarmState.fresh(config, 7)
    for part in np.array_split(probs, [0, 1, 17, 130, 256, 257, 1_000, 1_000, 2_500], axis=1):
        chunked = chunked.fold(part)
    for name in ("raised_at", "cleared_at", "raises"):
        assert getattr(whole, name).tolist() == getattr(chunked, name).tolist()
    assert whole.predictions == chunked.predictions and whole.recent_weight == chunked.recent_weight
    for name in ("log_statistic", "log_clear", "since_sum", "recent_sum"):
        np.testing.assert_allclose(getattr(whole, name), getattr(chunked, name), rtol=1e-12, atol=1e-9)
    single = LabelShiftAlarmState.fresh(config)
    for row in probs[3, :900]:
        single = single.fold(row)
    single = single.fold(probs[3, 900:])
    np.testing.assert_allclose(single.log_statistic, whole.log_statistic[3:4], rtol=1e-12, atol=1e-9)
    assert single.raised_at[0] == whole.raised_at[3] and single.cleared_at[0] == whole.cleared_at[3]
    np.testing.assert_allclose(  # the state's statistic is the mixture of the CUSUMs of the e-values
        _raising_trajectory(config, probs[:, : int(whole.raised_at.min()) + 1])[:, -1],
        LabelShiftAlarmState.fresh(config, 7).fold(probs[:, : int(whole.raised_at.min()) + 1]).log_mixture,
        rtol=1e-12,
    )


def test_to_dict_round_trips_exactly_through_json():
    config = LabelShiftAlarmConfig(
        reference=(0.25, 0.25, 0.5), n_reference=300, tolerance=0.03, threshold=500.0, clear_threshold=300.0
    )
    rng = np.random.default_rng(6)
    probs = np.concatenate([rng.dirichlet((1, 1, 2), 500), rng.dirichlet((1, 1, 8), 300)])
    state = LabelShiftAlarmState.fresh(config).fold(probs)
    assert state.alarmed[0]
    back = LabelShiftAlarmState.from_dict(json.loads(json.dumps(state.to_dict())), config)
    assert back == state
    assert back.log_clear.tobytes() == state.log_clear.tobytes()
    assert back.fold(probs[:100]) == state.fold(probs[:100])
    # saved under other settings: not this alarm's evidence
    other = LabelShiftAlarmConfig(reference=(0.25, 0.25, 0.5), n_reference=301, tolerance=0.03, threshold=500.0)
    assert LabelShiftAlarmState.from_dict(state.to_dict(), other) == LabelShiftAlarmState.fresh(other)
    with pytest.raises(ValueError, match="`log_clear`"):
        LabelShiftAlarmState.from_dict({**state.to_dict(), "log_clear": None}, config)
    with pytest.raises(ValueError, match="`data`"):
        LabelShiftAlarmState.from_dict({k: v for k, v in state.to_dict().items() if k != "raises"}, config)


def test_the_reference_margins_hold_for_all_but_epsilon_of_validation_draws():
    """Seeded: 1,000 validation draws of 200 rows from the digits-like pool (its means taken as the truth). The
    share of draws where some class's true mean leaves [q - r^-, q + r^+] is at most epsilon = 1%, within sampling
    error; with no margins every draw leaves them."""
    p, _, _, _ = _pool()
    truth = p.mean(axis=0)
    rng = np.random.default_rng(7)
    missed = 0
    for _ in range(1_000):
        q = p[rng.integers(0, len(p), 200)].mean(axis=0)
        below, above = reference_tolerance(200, q / q.sum(), 0.01)
        missed += bool(np.any((truth < q - below) | (truth > q + above)))
    assert missed <= _binomial_high(1_000, 0.01)


def test_margins_shrink_with_rows_and_towards_rare_classes():
    below, above = reference_tolerance(359, [0.5, 0.3, 0.15, 0.05])
    assert np.all(np.diff(above) < 0) and np.all(np.diff(below) < 0)
    assert np.all(below[1:] < above[1:])  # skewed towards 1/2
    big_below, big_above = reference_tolerance(10_000, [0.5, 0.3, 0.15, 0.05])
    assert np.all(big_above < above / 4) and np.all(big_below < below / 4)
    config = LabelShiftAlarmConfig(reference=(0.5, 0.3, 0.15, 0.05), n_reference=359, tolerance=0.02)
    np.testing.assert_allclose(config.upper, np.minimum(1, [0.5, 0.3, 0.15, 0.05] + above + 0.02))
    assert config.live[0].all() and config.live[1, :3].all() and not config.live[1, 3]  # 0.05 - r^- - 0.02 < 0


def test_defaults_and_the_manifest_entry():
    assert threshold_for(DEFAULT_PREDICTIONS, DEFAULT_RATE) == DEFAULT_THRESHOLD == 1e8
    rng = np.random.default_rng(8)
    entry = LabelShiftReference.from_rows(rng.dirichlet((1, 1, 1), 400), rng.integers(0, 3, 400))
    config = LabelShiftAlarmConfig.for_reference(entry, tolerance=0.01)
    assert config.reference == tuple(entry.mean_probabilities) and config.n_reference == 400
    assert config.tolerance == 0.01 and config.threshold == DEFAULT_THRESHOLD and config.live.all()
    # a side whose edge is 1 or 0 has no detector and no weight
    skewed = LabelShiftAlarmConfig(reference=(0.98, 0.02), tolerance=0.05)
    assert skewed.live.tolist() == [[False, True], [True, False]]
    assert np.isneginf(skewed.log_weights).sum() == 2 * len(skewed.fractions)
    state = LabelShiftAlarmState.fresh(skewed).fold([[1.0, 0.0]] * 50)  # the trivial sides cannot raise
    assert not state.alarmed[0] and state.summary()["classes"][0]["up"] is None


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: LabelShiftAlarmConfig(reference=(1.0,)), "reference"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.6)), "reference"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, float("nan"))), "reference"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), n_reference=0), "n_reference"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), tolerance=1.0), "tolerance"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), tolerance=0.6), "tolerance"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), epsilon=0.0), "epsilon"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), threshold=1.0), "threshold"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), clear_threshold=float("inf")), "clear_threshold"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), min_clear=-1), "min_clear"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), fractions=(0.5, 1.0)), "fractions"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), fractions=()), "fractions"),
        (lambda: LabelShiftAlarmConfig(reference=(0.5, 0.5), half_life=0.0), "half_life"),
        (lambda: LabelShiftAlarmState.fresh(_config(), streams=0), "streams"),
        (lambda: LabelShiftAlarmState.fresh(_config()).fold([[0.5, 0.5, 0.0]]), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config()).fold([[0.5, 0.6]]), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config()).fold([[0.5, float("nan")]]), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config()).fold([[1.5, -0.5]]), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config(), streams=2).fold([[0.5, 0.5]]), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config()).fold(np.full((1, 2, 2, 2), 0.5)), "probs"),
        (lambda: LabelShiftAlarmState.fresh(_config(), streams=2).to_dict(), "streams"),
        (lambda: LabelShiftAlarmState.fresh(_config(), streams=2).summary(), "streams"),
        (lambda: reference_tolerance(0, [0.5, 0.5]), "n"),
        (lambda: reference_tolerance(10, [0.5, 0.5], 1.0), "epsilon"),
        (lambda: reference_tolerance(10, [[0.5, 0.5]]), "reference"),
        (lambda: threshold_for(0, 0.01, "predictions"), "predictions"),
        (lambda: threshold_for(10, 1.0), "rate"),
    ],
)
def test_bad_arguments_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()


def _config() -> LabelShiftAlarmConfig:
    return LabelShiftAlarmConfig(reference=(0.5, 0.5))


def test_a_row_that_does_not_sum_to_one_is_named():
    with pytest.raises(ValueError, match="rows summing to 1.*one sums to 1.1"):
        LabelShiftAlarmState.fresh(_config()).fold([[0.5, 0.5], [0.5, 0.6]])
    empty = LabelShiftAlarmState.fresh(_config()).fold(np.zeros((0, 2)))
    assert empty == LabelShiftAlarmState.fresh(_config())
