"""calibkit.eprocess: the e-process core against the step-by-step recursion, and the three alarms folded through it
against the outputs the alarms recorded before they shared it (``recorded_alarms.py``).

Tolerance: the alarms' decisions (the raise and clear indices) must be identical; statistics agree to a relative
1e-9. The core folds by cumulative sums, which round differently from the recursion: the absolute error of a
log S grows like (observations folded) x (double spacing) x (largest |log S| on the way), at most 3,000 x 1.1e-16
x 100 = 3.3e-11 for the recorded streams, and a relative error of S equals the absolute error of log S.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from calibkit import eprocess
from calibkit.eprocess import EProcess, EState, advance, cusum, threshold_for

sys.path.insert(0, str(Path(__file__).parent))
import recorded_alarms  # noqa: E402

RTOL = 1e-9


@pytest.fixture(scope="module")
def outputs():
    return recorded_alarms.load(), recorded_alarms.run()


def _close(old, new, path=""):
    """Equal structures; numbers to RTOL (relative), integers and strings exactly."""
    if isinstance(old, dict):
        assert set(old) <= set(new), path
        for key in old:
            _close(old[key], new[key], f"{path}.{key}")
    elif isinstance(old, list) and old and isinstance(old[0], (list, float)):
        np.testing.assert_allclose(np.asarray(new, float), np.asarray(old, float), rtol=RTOL, atol=0, err_msg=path)
    else:
        assert old == new, path


@pytest.mark.parametrize("alarm", ["detector", "coverage", "shift"])
@pytest.mark.parametrize("fold", ["single", "batch"])
def test_the_alarms_decide_as_recorded_before_the_core(outputs, alarm, fold):
    old, new = (o[alarm][fold] for o in outputs)
    for name in ("raised", "cleared", "events"):  # the decisions: identical
        if name in old:
            assert old[name] == new[name], name
    assert any(old.get("raised", old.get("events")))
    for name in ("statistic", "clear"):
        if name in old:
            _close(old[name], new[name], name)
    if alarm == "detector" and old.get("state"):  # format 8 stores the e-process's fields, not the recursion's
        for name in ("log_statistic", "gap_sum", "weight", "table", "alarm_gap", "raised_gap", "run_gap"):
            _close(old["state"][name], new["state"][name], name)
        assert new["state"]["n"] == recorded_alarms.LABELS
    elif old.get("state"):
        _close(old["state"], new["state"])


def test_the_recording_holds_raises_and_clears_of_every_alarm(outputs):
    old = outputs[0]
    assert all(old["detector"]["batch"]["cleared"]) and all(old["detector"]["batch"]["raised"])
    assert min(old["coverage"]["batch"]["raised"][-1]) >= 0
    raised, cleared, raises = old["shift"]["batch"]["events"][-1]
    assert min(cleared) >= 0 and min(raises) >= 2


def _process(min_clear: int = 10) -> EProcess:
    weights = np.log([0.5, 0.3, 0.2])
    return EProcess(weights, np.exp(5.0), [[0, 1], [2, 3]], 4, np.exp(4.0), min_clear)


def _e_values(seed: int, rows: int = 3_000, streams: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(T, streams, 3) raising and (T, streams, 4) clearing log e-values with drifts that switch sign every few
    hundred rows: the raising ones gain while the clearing ones lose, and back."""
    rng = np.random.default_rng(seed)
    drift = np.where((np.arange(rows)[:, None] + 97 * np.arange(streams)) // 300 % 2 == 1, 0.08, -0.08)
    log_e = drift[..., None] * [1.0, 0.6, 1.5] + rng.normal(0.0, 0.3, (rows, streams, 3))
    log_c = -drift[..., None] * [1.0, 0.5, 0.8, 1.2] + rng.normal(0.0, 0.3, (rows, streams, 4))
    return log_e, log_c


def _step_by_step(process: EProcess, state: EState, log_e: np.ndarray, log_c_e: np.ndarray):
    """The recursion label by label: (log S, log K, raised (T, streams), cleared (T, streams))."""
    log_s, log_c = state.log_statistic.copy(), state.log_clear.copy()
    raised_at, cleared_at = state.raised_at.copy(), state.cleared_at.copy()
    ups, downs = [], []
    for t in range(len(log_e)):
        index, alarmed = state.count + t, raised_at > cleared_at
        log_s = np.maximum(log_s, 0.0) + log_e[t]
        up = ~alarmed & (process.log_mixture(log_s) >= process.log_threshold)
        log_c = np.where(alarmed[:, None], np.maximum(log_c, 0.0) + log_c_e[t], 0.0)
        level = process.log_clear_statistic(log_c) >= process.log_clear_threshold
        down = alarmed & (index - raised_at >= process.min_clear) & level
        log_s[down], log_c[down] = 0.0, 0.0
        raised_at[up], cleared_at[down] = index, index
        ups.append(up)
        downs.append(down)
    return log_s, log_c, np.array(ups), np.array(downs)


def _fold(process: EProcess, state: EState, log_e: np.ndarray, log_c_e: np.ndarray, ends):
    """``advance`` over the rows, in chunks ending at ``ends``: (state, raised (T, streams), cleared)."""
    raised, cleared = np.zeros(log_e.shape[:2], bool), np.zeros(log_e.shape[:2], bool)
    start = 0
    for end in ends:
        i = start
        while i < end:
            step = advance(process, state, log_e[i:end], log_c_e[i:end])
            state, i = step.state, i + step.taken
            raised[i - 1], cleared[i - 1] = step.raised, step.cleared
        start = end
    return state, raised, cleared


def test_the_mixture_is_the_weighted_sum_of_the_detectors():
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(6))
    process = EProcess(np.log(w), 10.0)
    log_s = rng.normal(0.0, 3.0, (50, 6))
    np.testing.assert_allclose(process.log_mixture(log_s), np.log(np.exp(log_s) @ w), rtol=1e-12)


def test_cusum_is_the_recursion():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, (500, 4, 3))
    start = rng.normal(0.0, 2.0, (4, 3))
    u, expected = cusum(start, x), []
    for row in x:
        start = np.maximum(start, 0.0) + row
        expected.append(start)
    np.testing.assert_allclose(u, np.array(expected), rtol=1e-12, atol=1e-12)
    positive = np.abs(x) + 0.1  # a CUSUM that never restarts adds in the recursion's order: bit for bit
    np.testing.assert_array_equal(cusum(np.zeros(3), positive[:, 0]), np.cumsum(positive[:, 0], axis=0))


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_advance_raises_and_clears_where_the_recursion_does(seed):
    process = _process()
    log_e, log_c = _e_values(seed)
    state = process.fresh(5)
    log_s, log_k, ups, downs = _step_by_step(process, state, log_e, log_c)
    after, raised, cleared = _fold(process, state, log_e, log_c, [len(log_e)])
    assert ups.sum() >= 5 and downs.sum() >= 5
    np.testing.assert_array_equal(raised, ups)
    np.testing.assert_array_equal(cleared, downs)
    np.testing.assert_allclose(after.log_statistic, log_s, rtol=RTOL, atol=1e-9)
    np.testing.assert_allclose(after.log_clear, log_k, rtol=RTOL, atol=1e-9)
    assert after.raises.tolist() == ups.sum(axis=0).tolist() and after.count == len(log_e)
    assert after.raised_at.tolist() == [int(np.flatnonzero(col)[-1]) for col in ups.T]


def test_events_do_not_depend_on_the_chunks():
    process = _process(min_clear=0)
    log_e, log_c = _e_values(5)
    whole, raised, cleared = _fold(process, process.fresh(5), log_e, log_c, [len(log_e)])
    ends = np.unique(np.r_[np.random.default_rng(6).integers(1, len(log_e), 80), len(log_e)])
    parts, raised_parts, cleared_parts = _fold(process, process.fresh(5), log_e, log_c, ends)
    np.testing.assert_array_equal(raised, raised_parts)
    np.testing.assert_array_equal(cleared, cleared_parts)
    np.testing.assert_allclose(whole.log_statistic, parts.log_statistic, rtol=RTOL, atol=1e-9)
    assert whole.raised_at.tolist() == parts.raised_at.tolist() and whole.raises.tolist() == parts.raises.tolist()


def test_the_json_state_round_trips_and_is_keyed_by_its_settings():
    process = _process()
    log_e, log_c = _e_values(7, rows=700, streams=1)
    state = _fold(process, process.fresh(), log_e, log_c, [700])[0]
    settings = {"threshold": 5.0, "bets": [1, 2]}
    data = json.loads(json.dumps(eprocess.state_dict(state, settings, 3, "labels")))
    assert data["labels"] == 700 and data["format"] == 3
    assert eprocess.read_state(data, settings, 3, "labels", 4) == state
    assert eprocess.read_state(data, {**settings, "threshold": 6.0}, 3, "labels", 4) is None
    assert eprocess.read_state(data, settings, 2, "labels", 4) is None
    assert eprocess.read_state(None, settings, 3, "labels", 4) is None
    with pytest.raises(ValueError, match="`data`"):
        eprocess.read_state({k: v for k, v in data.items() if k != "raises"}, settings, 3, "labels", 4)
    with pytest.raises(ValueError, match="`streams`"):
        eprocess.state_dict(process.fresh(2), settings, 3, "labels")
    raising_only = EProcess(np.log([0.5, 0.5]), 10.0)
    fresh = raising_only.fresh()
    data = eprocess.state_dict(fresh, {}, 1, "labels")
    assert "log_clear" not in data and eprocess.read_state(data, {}, 1, "labels", 0) == fresh


def test_the_state_is_frozen_and_checked():
    state = _process().fresh(2)
    with pytest.raises(ValueError):
        state.log_statistic[0, 0] = 1.0
    with pytest.raises(ValueError, match="`raised_at`"):
        EState(np.zeros((1, 3)), np.zeros((1, 4)), 5, [5], [-1], [1])
    with pytest.raises(ValueError, match="`cleared_at`"):
        EState(np.zeros((1, 3)), np.zeros((1, 4)), 5, [-1], [2], [0])
    with pytest.raises(ValueError, match="`log_statistic`"):
        EState(np.full((1, 3), np.nan), np.zeros((1, 4)), 5, [-1], [-1], [0])
    with pytest.raises(ValueError, match="`streams`"):
        _process().fresh(0)
    with pytest.raises(ValueError, match="`log_clear_e`"):
        alarmed = EState(np.zeros((1, 3)), np.zeros((1, 4)), 5, [3], [-1], [1])
        advance(_process(), alarmed, np.zeros((2, 1, 3)))


def test_threshold_for_is_the_union_bound():
    assert threshold_for(10_000, 0.01) == 1e6
    for n, rate, name in ((0, 0.01, "labels"), (True, 0.01, "labels"), (10, 1.0, "rate"), (10, False, "rate")):
        with pytest.raises(ValueError, match=f"`{name}`"):
            threshold_for(n, rate)
    with pytest.raises(ValueError, match="`predictions`"):
        threshold_for(1.5, 0.01, "predictions")
