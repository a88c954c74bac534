"""calibkit.temperature: identity, argmax invariance, recovery of a known temperature, bad input."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from calibkit import metrics
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import ECE_GRID, apply_temperature, fit_temperature, softmax

logit_matrices = st.integers(2, 6).flatmap(
    lambda k: hnp.arrays(np.float64, st.tuples(st.integers(1, 30), st.just(k)), elements=st.floats(-50, 50))
)


@settings(max_examples=80, deadline=None)
@given(logit_matrices, st.floats(0.05, 20.0))
def test_temperature_never_changes_the_argmax(z, t):
    gap = z.max(axis=1, keepdims=True) - z
    # exact ties stay ties; gaps below float resolution (e.g. 1e-70) give identical probabilities
    assume(np.all((gap == 0) | (gap > 1e-6)))
    q = apply_temperature(z, t)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(q.argmax(axis=1), z.argmax(axis=1))


@settings(max_examples=40, deadline=None)
@given(logit_matrices)
def test_unit_temperature_is_the_identity(z):
    np.testing.assert_allclose(apply_temperature(z, 1.0), softmax(z), atol=1e-15)


def test_softmax_is_stable_for_huge_logits():
    q = softmax(np.array([[1000.0, 0.0, -1000.0]]))
    np.testing.assert_allclose(q, [[1.0, 0.0, 0.0]])


def test_binary_single_logit_uses_the_sigmoid():
    z = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(apply_temperature(z, 2.0), 1 / (1 + np.exp(-z / 2.0)))


@pytest.mark.parametrize("scale", [2.5, 1.6, 0.5])
def test_nll_fit_recovers_the_scaling_of_a_calibrated_source(scale):
    z, y = calibrated_logits(50_000, seed=11)
    t = fit_temperature(scale * z, y)
    assert t == pytest.approx(scale, rel=0.04)
    assert metrics.ece(apply_temperature(scale * z, t), y) < 0.01


def test_calibrated_source_gets_temperature_near_one():
    z, y = calibrated_logits(50_000, seed=12)
    assert fit_temperature(z, y) == pytest.approx(1.0, abs=0.03)


def test_ece_objective_grid_search():
    z, y = calibrated_logits(20_000, seed=13)
    t = fit_temperature(2.5 * z, y, objective="ece")
    assert t in ECE_GRID
    assert t == pytest.approx(2.5, abs=0.15)
    assert ECE_GRID[0] == 0.05 and ECE_GRID[-1] == 10.0 and len(ECE_GRID) == 200


def test_binary_single_logit_fit():
    rng = np.random.default_rng(5)
    z = rng.normal(0, 3, 40_000)
    y = (rng.random(40_000) < 1 / (1 + np.exp(-z))).astype(int)
    assert fit_temperature(2.0 * z, y) == pytest.approx(2.0, rel=0.05)


def test_separable_data_wants_a_small_temperature():
    # NLL keeps falling as T -> 0 and underflows to 0 below T ~ 0.1: every such T is optimal
    z = np.array([[5.0, -5.0], [-5.0, 5.0]])
    assert 0.01 <= fit_temperature(z, np.array([0, 1])) < 0.2


@pytest.mark.parametrize("t", [0, -1, np.nan, np.inf, "hot", None])
def test_bad_temperature(t):
    with pytest.raises(ValueError, match="Expected `temperature` to be a positive"):
        apply_temperature(np.zeros((1, 3)), t)


def test_bad_fit_input():
    with pytest.raises(ValueError, match="Expected `objective` to be 'nll' or 'ece'"):
        fit_temperature(np.zeros((2, 3)), np.array([0, 1]), objective="brier")
    with pytest.raises(ValueError, match="logits contain 1 NaN"):
        fit_temperature(np.array([[np.nan, 0.0]]), np.array([0]))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        fit_temperature(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="logits is empty"):
        fit_temperature(np.zeros((0, 3)), np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match="at least 2 columns"):
        fit_temperature(np.zeros((2, 1)), np.array([0, 0]))
