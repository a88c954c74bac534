"""calibkit.detector and calibkit.alarms: validity under the tolerance, detection, clearing, persistence."""

import numpy as np
import pytest

from bench.alarm.oracle import unconditional_median
from bench.alarm.simulation import draw, run_detector, simulate
from bench.alarm.traffic import Miscalibration, TrafficShape
from calibkit.alarms import ALARM, OK, WARNING, AlarmPolicy, AlarmStatus, Evidence, assess
from calibkit.detector import _FIELDS, DetectorConfig, DetectorState
from calibkit.drift import ShiftTest

CIFAR = TrafficShape("cifar-like", 10, 2.5)
DIGITS = TrafficShape("digits-like", 10, 20.0)
BINARY = TrafficShape("binary", 2, 3.0)


@pytest.mark.parametrize("shape", [CIFAR, DIGITS, BINARY], ids=lambda s: s.name)
@pytest.mark.parametrize("mean_preserving", [False, True])
def test_false_alarms_stay_under_n_over_a_at_the_edge_of_the_tolerance(shape, mean_preserving):
    # the hardest null: accuracy exactly `tolerance` away from confidence at every level. With A = 2,000
    # the bound n / A is 15% over 300 labels, so a detector whose e-values were not e-values would break it.
    config = DetectorConfig(threshold=2_000.0)
    edge = Miscalibration("edge", gap=config.tolerance, mean_preserving=mean_preserving, pivot=0.8)
    out = simulate(shape, edge, streams=400, before=0, during=300, config=config, seed=11)
    rate = np.mean(out.delay >= 0)
    assert rate <= 300 / 2_000


def test_e_values_have_mean_at_most_one_under_the_null():
    state = DetectorState(DetectorConfig(), streams=500)
    rng = np.random.default_rng(5)
    edge = Miscalibration("edge", gap=0.01)
    confidence, correct, _ = edge.sample(CIFAR, rng, (500, 400))
    e = state.fold(confidence, correct).e_value
    learned = e[:, : state.config.learned]
    assert (learned != 1.0).mean() > 0.1  # the detector does bet at the edge of the null
    assert learned.min() >= 0.5 - 1e-12  # max_bet: no single label can cost a learned bet more than half
    for d in range(e.shape[1]):
        assert e[:, d].mean() <= 1.0 + 3 * e[:, d].std() / np.sqrt(e[:, d].size) + 1e-12


def test_fixed_alternatives_are_e_values_at_every_point_of_the_null_band():
    # E_p[e] = p e(Y=1) + (1 - p) e(Y=0) <= 1 for every accuracy p within the tolerance of the confidence:
    # logit scales, constant gaps and steps on either side of every pivot
    config = DetectorConfig()
    assert config.fixed == len(config.scales) + len(config.gaps) + 2 * len(config.steps) * len(config.pivots)
    state = DetectorState(config, streams=1)
    c = np.concatenate([np.linspace(0.05, 0.995, 400), 1 - np.logspace(-12, -3, 50)])[None, :]
    win, lose = state._fixed_e_values(c, np.ones_like(c)), state._fixed_e_values(c, np.zeros_like(c))
    assert win.shape == (1, config.fixed, c.shape[1])
    for p in (c - config.tolerance, c, c + config.tolerance):
        p = np.clip(p, 0.0, 1.0)[:, None, :]
        assert (p * win + (1 - p) * lose).max() <= 1.0 + 1e-9
    assert (win != 1.0).any() and (lose != 1.0).any()


def test_the_statistic_is_the_weighted_mixture_of_the_detectors():
    config = DetectorConfig()
    state = DetectorState(config, streams=3)
    confidence, correct, _ = Miscalibration("x2.5", logit_scale=2.5).sample(CIFAR, np.random.default_rng(8), (3, 200))
    state.fold(confidence, correct)
    weights = np.exp(config.log_weights)
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(state.statistic, (weights * np.exp(state.log_statistic)).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("shape", [CIFAR, DIGITS, BINARY], ids=lambda s: s.name)
def test_the_default_alarm_stays_quiet_at_the_edge_of_the_tolerance(shape):
    # the default A was chosen on make bench-alarm's tolerance-edge rows (at most 1% per 10,000 labels); a seeded
    # check of the hardest of them: over-confident by exactly eps, and eps with a sign that flips every 300 labels
    for traffic, flip in ((Miscalibration("over", gap=0.01), 0), (Miscalibration("flip", gap=0.01), 300)):
        confidence, correct = draw(shape, traffic, 200, 0, 3_000, seed=21, flip=flip)
        out = run_detector(confidence, correct, 0, 3_000)
        assert np.mean(out.delay >= 0) <= 0.02, traffic.name


def test_calibrated_streams_raise_nothing_and_shifts_are_caught_then_cleared():
    calibrated = simulate(CIFAR, None, streams=100, before=5_000, seed=1)
    assert not calibrated.false_alarm.any()
    over = simulate(
        CIFAR, Miscalibration("x2.5", logit_scale=2.5), streams=100, before=2_000, during=1_500, after=3_000, seed=2
    )
    assert np.mean((over.delay >= 0) & (over.delay <= 400)) >= 0.95  # population ECE 0.22
    # the clearing alternative is the gap learned from the labels since the alarm, so a large
    # miscalibration clears within a few hundred labels of its end and, at the level B, does not clear
    # while it lasts
    assert not over.flaps.any()
    assert np.mean(over.clear_delay >= 0) >= 0.95 and np.median(over.clear_delay) <= 200


def test_a_persisting_shift_near_the_tolerance_rarely_clears_while_it_lasts():
    # binary logits x1.25 (population ECE 0.022, a gap of about twice the tolerance): the clearing test pits
    # calibration against the gap learned since the alarm, which the persisting shift keeps at least that
    # large, so at the level B few detected streams clear while it lasts
    out = simulate(BINARY, Miscalibration("x1.25", logit_scale=1.25), streams=200, before=1_000, during=7_000, seed=4)
    detected = out.delay >= 0
    assert detected.mean() >= 0.6
    assert np.mean(out.flaps[detected] > 0) <= 0.05


def test_the_clearing_gap_has_bins_of_its_own_above_the_top_bin_of_the_bets():
    # a shift at C = 0.9999 (accuracy 0.9) beside calibrated labels at C = 0.999995: both lie above the bets' top
    # edge (C = 0.9985), so one gap of the bets averages them; the clearing bins keep them apart, and the clearing
    # test pits calibration against -0.1 where the shift is, and against nothing where the labels are calibrated
    rng = np.random.default_rng(5)
    confidence = np.tile([0.9999, 0.999995], 1_000)[None, :]
    correct = (rng.random(confidence.shape) < np.where(confidence < 0.99999, 0.9, confidence)).astype(float)
    state = DetectorState(DetectorConfig(), 1)
    assert state.fold(confidence, correct).raised.any() and state.alarmed[0]
    top = state.config.n_bins - 1
    assert top == np.searchsorted(state.config.edges, 0.9999) == np.searchsorted(state.config.edges, 0.999995)
    shifted, calibrated = np.searchsorted(state.config.clear_edges, [0.9999, 0.999995])
    assert shifted != calibrated and state.config.clear_to_bin[shifted] == state.config.clear_to_bin[calibrated] == top
    gap = state.clear_alternative()[0]
    assert gap[shifted] == pytest.approx(-0.1, abs=0.03) and gap[calibrated] == 0.0


def test_mean_preserving_miscalibration_is_caught_by_the_steps():
    # over-confident above the median confidence, under-confident below: the mean residual is about 0, so a bet on
    # the mean gap sees nothing; the step alternatives bet on exactly this shape and catch it within a few hundred
    # labels
    shift = Miscalibration("mean-preserving", gap=0.1, mean_preserving=True, pivot=0.946)
    confidence, _, accuracy = shift.sample(BINARY, np.random.default_rng(0), (100_000,))
    assert abs(np.mean(accuracy - confidence)) < 0.01
    out = simulate(BINARY, shift, streams=100, before=1_000, during=3_000, after=2_000, seed=3)
    assert np.mean(out.delay >= 0) >= 0.95 and unconditional_median(out.delay) <= 220
    assert np.mean(out.latched) <= 0.05


def test_streams_are_independent_and_persistence_round_trips():
    rng = np.random.default_rng(4)
    confidence, correct = CIFAR.sample(rng, (3, 500))
    together = DetectorState(DetectorConfig(), streams=3)
    alone = DetectorState(DetectorConfig())
    together.fold(confidence, correct)
    for t in range(500):
        alone.fold(confidence[1:2, t], correct[1:2, t])
    assert together.statistic[1] == pytest.approx(alone.statistic[0], rel=1e-12)  # BLAS may sum in another order
    np.testing.assert_allclose(together.table[1], alone.table[0], rtol=1e-12, atol=1e-15)
    restored = DetectorState.from_dict(alone.to_dict(), DetectorConfig())
    for name in _FIELDS:
        np.testing.assert_array_equal(getattr(restored, name), getattr(alone, name))
    fresh = DetectorState.from_dict(alone.to_dict(), DetectorConfig(tolerance=0.02))
    assert fresh.n[0] == 0  # evidence gathered under another tolerance is not carried over
    assert DetectorState.from_dict({"bets": [0.1], "values": [1.0]}, DetectorConfig()).n[0] == 0
    with pytest.raises(ValueError, match="tolerance"):
        DetectorConfig(tolerance=-0.1)


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 1000])
def test_folding_in_any_chunks_gives_the_same_state_bit_for_bit(chunk):
    # block boundaries follow the label count, so the evaluation cadence cannot change a decision
    shift = Miscalibration("x2.5", logit_scale=2.5)
    confidence, correct, _ = shift.sample(CIFAR, np.random.default_rng(6), (2, 1_000))
    whole, parts = DetectorState(DetectorConfig(), 2), DetectorState(DetectorConfig(), 2)
    events = whole.fold(confidence, correct)
    raised = np.concatenate(
        [parts.fold(confidence[:, i : i + chunk], correct[:, i : i + chunk]).raised for i in range(0, 1_000, chunk)],
        axis=1,
    )
    for name in _FIELDS:
        np.testing.assert_array_equal(getattr(whole, name), getattr(parts, name), err_msg=name)
    np.testing.assert_array_equal(events.raised, raised)
    assert events.raised.any()


def test_bets_use_only_labels_of_earlier_blocks():
    # the bets of a block are fixed before its first label: changing a label changes no e-value of
    # its own block (the e-values follow the label's own outcome only through Y - C)
    config = DetectorConfig(block=16)
    confidence, correct = CIFAR.sample(np.random.default_rng(7), (1, 64))
    flipped = correct.copy()
    flipped[0, 35] = 1 - flipped[0, 35]
    a, b = DetectorState(config), DetectorState(config)
    ea, eb = a.fold(confidence, correct).e_value, b.fold(confidence, flipped).e_value
    same = np.ones(64, bool)
    same[35] = False
    np.testing.assert_array_equal(ea[..., :48][..., same[:48]], eb[..., :48][..., same[:48]])
    assert not np.array_equal(a.table, b.table)


def test_fold_rejects_arrays_of_the_wrong_shape():
    with pytest.raises(ValueError, match="shape"):
        DetectorState(DetectorConfig(), 2).fold([0.9, 0.8, 0.7], [1, 0, 1])


POLICY = AlarmPolicy()


def test_alarm_is_the_detector_state_with_its_reasons():
    alarmed = Evidence(
        n=900, alarmed=True, statistic=2e6, clear_statistic=3.0, worst_gap=-0.12, worst_confidence=(0.6, 0.7)
    )
    status = assess(AlarmStatus(), alarmed, POLICY, now=10.0)
    assert status.state == ALARM and status.since == 10.0
    assert "-0.120 at confidence 0.600-0.700" in status.reasons[1] and "now 3" in status.reasons[2]
    held = assess(status, alarmed, POLICY, now=20.0)
    assert held.since == 10.0
    cleared = assess(held, Evidence(n=1500, statistic=1.0), POLICY, now=30.0)
    assert cleared.state == OK and cleared.since == 30.0


def test_warnings_need_no_guarantee():
    building = assess(AlarmStatus(), Evidence(n=400, statistic=5e3), POLICY, now=1.0)
    assert building.state == WARNING and "building" in building.reasons[0]
    shifted = ShiftTest(0.4, 1e-9, 500, 359, 0.8, 0.97)
    status = assess(AlarmStatus(), Evidence(n=0, shift=shifted), POLICY, now=1.0)
    assert status.state == WARNING and "KS D = 0.400" in status.reasons[0]
    few = ShiftTest(0.4, 1e-9, 20, 359, 0.8, 0.97)
    assert assess(AlarmStatus(), Evidence(n=0, shift=few), POLICY, now=1.0).state == OK
