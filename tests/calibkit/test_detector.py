"""calibkit.detector, calibkit.calibration_bets and calibkit.alarms: validity under the tolerance, detection,
clearing, persistence."""

import numpy as np
import pytest

from calibkit.alarms import ALARM, OK, WARNING, AlarmPolicy, AlarmStatus, Evidence, assess
from calibkit.calibration_bets import fixed_e_values
from calibkit.detector import _FIELDS, DetectorConfig, DetectorState
from calibkit.drift import ShiftTest
from calibkit.synthetic import Miscalibration, TrafficShape

CIFAR = TrafficShape("cifar-like", 10, 2.5)
DIGITS = TrafficShape("digits-like", 10, 20.0)
BINARY = TrafficShape("binary", 2, 3.0)


def test_e_values_have_mean_at_most_one_under_the_null():
    state = DetectorState(DetectorConfig(), streams=500)
    rng = np.random.default_rng(5)
    edge = Miscalibration("edge", gap=0.01)
    confidence, correct, _ = edge.sample(CIFAR, rng, (500, 400))
    e = state.trace(confidence, correct)[1].e_value
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
    c = np.concatenate([np.linspace(0.05, 0.995, 400), 1 - np.logspace(-12, -3, 50)])[None, :]
    win, lose = fixed_e_values(config, c, np.ones_like(c)), fixed_e_values(config, c, np.zeros_like(c))
    assert win.shape == (1, config.fixed, c.shape[1])
    for p in (c - config.tolerance, c, c + config.tolerance):
        p = np.clip(p, 0.0, 1.0)[:, None, :]
        assert (p * win + (1 - p) * lose).max() <= 1.0 + 1e-9
    assert (win != 1.0).any() and (lose != 1.0).any()


def test_the_statistic_is_the_weighted_mixture_of_the_detectors():
    config = DetectorConfig()
    state = DetectorState(config, streams=3)
    confidence, correct, _ = Miscalibration("x2.5", logit_scale=2.5).sample(CIFAR, np.random.default_rng(8), (3, 200))
    state = state.fold(confidence, correct)
    weights = np.exp(config.log_weights)
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(state.statistic, (weights * np.exp(state.log_statistic)).sum(axis=1), rtol=1e-12)


def test_the_clearing_gap_has_bins_of_its_own_above_the_top_bin_of_the_bets():
    # a shift at C = 0.9999 (accuracy 0.9) beside calibrated labels at C = 0.999995: both lie above the bets' top
    # edge (C = 0.9985), so one gap of the bets averages them; the clearing bins keep them apart, and the clearing
    # test pits calibration against -0.1 where the shift is, and against nothing where the labels are calibrated
    rng = np.random.default_rng(5)
    confidence = np.tile([0.9999, 0.999995], 1_000)[None, :]
    correct = (rng.random(confidence.shape) < np.where(confidence < 0.99999, 0.9, confidence)).astype(float)
    state = DetectorState(DetectorConfig(), 1)
    state, fold = state.trace(confidence, correct)
    assert fold.raised.any() and state.alarmed[0]
    top = state.config.n_bins - 1
    assert top == np.searchsorted(state.config.edges, 0.9999) == np.searchsorted(state.config.edges, 0.999995)
    shifted, calibrated = np.searchsorted(state.config.clear_edges, [0.9999, 0.999995])
    assert shifted != calibrated and state.config.clear_to_bin[shifted] == state.config.clear_to_bin[calibrated] == top
    gap = state.clear_alternative()[0]
    assert gap[shifted] == pytest.approx(-0.1, abs=0.03) and gap[calibrated] == 0.0


def test_streams_are_independent_and_persistence_round_trips():
    rng = np.random.default_rng(4)
    confidence, correct = CIFAR.sample(rng, (3, 500))
    together = DetectorState(DetectorConfig(), streams=3)
    alone = DetectorState(DetectorConfig())
    together = together.fold(confidence, correct)
    for t in range(500):
        alone = alone.fold(confidence[1:2, t], correct[1:2, t])
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
def test_folding_in_any_chunks_gives_the_same_events_and_the_state_to_rounding(chunk):
    # block boundaries follow the label count, so the evaluation cadence cannot change a decision; the e-process
    # folds by cumulative sums, whose rounding depends on where a chunk starts
    shift = Miscalibration("x2.5", logit_scale=2.5)
    confidence, correct, _ = shift.sample(CIFAR, np.random.default_rng(6), (2, 1_000))
    parts = DetectorState(DetectorConfig(), 2)
    whole, events = parts.trace(confidence, correct)
    raised = []
    for i in range(0, 1_000, chunk):
        parts, fold = parts.trace(confidence[:, i : i + chunk], correct[:, i : i + chunk])
        raised.append(fold.raised)
    for name in _FIELDS:
        np.testing.assert_allclose(getattr(whole, name), getattr(parts, name), rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(events.raised, np.concatenate(raised, axis=1))
    assert events.raised.any()


def test_bets_use_only_labels_of_earlier_blocks():
    # the bets of a block are fixed before its first label: changing a label changes no e-value of
    # its own block (the e-values follow the label's own outcome only through Y - C)
    config = DetectorConfig(block=16)
    confidence, correct = CIFAR.sample(np.random.default_rng(7), (1, 64))
    flipped = correct.copy()
    flipped[0, 35] = 1 - flipped[0, 35]
    a, b = DetectorState(config), DetectorState(config)
    (a, fa), (b, fb) = a.trace(confidence, correct), b.trace(confidence, flipped)
    ea, eb = fa.e_value, fb.e_value
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
