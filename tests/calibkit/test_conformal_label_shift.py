"""Prediction sets under label shift (calibkit.conformal.weighted): the weighted conformal quantile of Podkopaev &
Ramdas 2021, its parity with split conformal at unit weights, its edge cases, and its coverage under a Dirichlet
label shift, with the true prior ratios and with EM's, against the unweighted sets that miss."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from calibkit.conformal import (
    SplitConformal,
    conformal_quantile,
    conformity_scores,
    label_shift_quantiles,
    label_shift_thresholds,
)
from calibkit.conformal.adaptive import aci_thresholds, misses_of
from calibkit.label_shift import em_priors
from calibkit.temperature import softmax

#: (method, parameters, randomized, floor): every rule the sets come in.
RULES = [
    ("lac", {}, False, False),
    ("aps", {}, True, False),
    ("raps", {"k_reg": 2, "lam": 0.05}, True, False),
    ("aps", {}, False, False),
    ("raps", {"k_reg": 2, "lam": 0.05}, False, True),
]
RULE_IDS = ["lac", "aps-randomized", "raps-randomized", "aps", "raps-floor"]


def _classwise(scores, labels, n_classes):
    order = np.lexsort((scores, labels))
    return np.asarray(scores)[order], np.bincount(labels, minlength=n_classes)


def _brute_force(scores, labels, weights, alpha):
    """The definition in exact rational arithmetic: per candidate y, the smallest calibration score whose weighted
    mass at or below it reaches 1 - alpha, the atom w_y at +inf included; +inf when none does or no mass."""
    w = [Fraction(float(v)) for v in weights]
    pairs = sorted(zip(scores, labels))
    out = []
    for y in range(len(w)):
        total = sum(w[label] for _, label in pairs) + w[y]
        q, mass = math.inf, Fraction(0)
        if total > 0:
            for s, label in pairs:
                mass += w[label]
                if mass / total >= 1 - Fraction(alpha):
                    q = s
                    break
        out.append(q)
    return np.array(out)


# --- parity and the definition ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 8, 9, 10, 99, 100, 999, 1000])
def test_unit_weights_give_the_split_conformal_quantile_bit_for_bit(n):
    rng = np.random.default_rng(n)
    for alpha in (0.01, 0.05, 0.059, 0.1, 0.2, 0.25, 0.5, 0.9, 0.99):
        for scores in (rng.random(n), rng.integers(0, 5, n).astype(float)):  # continuous, and with ties
            labels = rng.integers(0, 4, n)
            q = conformal_quantile(scores, alpha)
            for scale in (1.0, 3.0):  # only the ratios matter
                assert np.array_equal(label_shift_quantiles(scores, labels, np.full(4, scale), alpha, 4), np.full(4, q))


@pytest.mark.parametrize("method, params, randomized, floor", RULES, ids=RULE_IDS)
def test_unit_weight_sets_are_the_split_conformal_sets_in_every_rule(method, params, randomized, floor):
    rng = np.random.default_rng(1)
    probs = softmax(rng.normal(0, 2, (300, 6)))
    labels = rng.integers(0, 6, 300)
    u_cal = rng.random(300) if randomized else None
    marginal = SplitConformal.fit(probs, labels, method, u=u_cal, floor=floor, **params)
    classwise = SplitConformal.fit(probs, labels, method, u=u_cal, floor=floor, classwise=True, **params)
    test = softmax(rng.normal(0, 2, (500, 6)))
    u = rng.random(500) if randomized else None
    for alpha in (0.05, 0.1, 0.3):
        assert np.array_equal(classwise.label_shift_quantiles(np.ones(6), alpha), np.full(6, marginal.quantile(alpha)))
        assert np.array_equal(classwise.label_shift_sets(test, np.ones(6), alpha, u=u), marginal.sets(test, alpha, u=u))


def test_the_thresholds_are_the_definitions_in_exact_arithmetic():
    """Random weights with zeros, tied scores and classes without calibration rows, against the definition."""
    rng = np.random.default_rng(2)
    for trial in range(200):
        k, n = int(rng.integers(2, 6)), int(rng.integers(1, 40))
        scores = rng.integers(0, 12, n) / 11.0
        labels = rng.integers(0, k, n)
        weights = rng.choice([0.0, 0.25, 1.0, 2.5, 7.0], size=k)
        if not weights.any():
            weights[0] = 1.0
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.5]))
        got = label_shift_quantiles(scores, labels, weights, alpha, k)
        np.testing.assert_array_equal(got, _brute_force(scores, labels, weights, alpha), err_msg=f"trial {trial}")


def test_weights_of_zero_and_tiny_classes():
    scores, labels = np.array([0.1, 0.2, 0.3, 0.4, 0.9]), np.array([0, 0, 0, 0, 1])
    # class 1 absent from serving: its row carries no mass, and no candidate weighs it
    assert label_shift_quantiles(scores, labels, [1.0, 0.0], 0.2, 2).tolist() == [0.4, 0.4]
    # a class without calibration rows: only its atom at +inf; over alpha of the mass, it is in every set
    q = label_shift_quantiles(scores, labels, [1.0, 1.0, 2.0], 0.2, 3)
    assert q[2] == math.inf and q[0] == q[1] == 0.9  # its atom weighs 2/7 > 0.2; the others' 1/6 <= 0.2 above 0.9
    # no mass on the calibration rows and none on the candidate: nothing to go on, every set holds it
    assert label_shift_quantiles(scores, labels, [0.0, 0.0, 1.0], 0.5, 3).tolist() == [math.inf, math.inf, math.inf]
    # a class of one row, up-weighted: the mass above its only score stays above alpha
    assert label_shift_quantiles(scores, labels, [1.0, 10.0], 0.1, 2).tolist() == [0.9, math.inf]


def test_aci_levels_feed_the_weighted_quantile_in_place_of_alpha():
    """The composition of the module docstring: at unit weights the weighted thresholds at ACI's levels are
    ``aci_thresholds``'; under a label shift with no correction at all (unit weights), ACI fed the weighted sets'
    misses keeps its deterministic bound |miss rate - alpha| <= (max(alpha_1, 1 - alpha_1) + gamma) / (gamma T)
    (Gibbs & Candès 2021, Proposition 4.1)."""
    rng = np.random.default_rng(3)
    scores, labels = rng.random(199), rng.integers(0, 3, 199)
    sorted_scores, counts = _classwise(scores, labels, 3)
    for level in np.linspace(0.001, 0.999, 97):
        want = aci_thresholds(np.sort(scores), level)
        assert np.array_equal(label_shift_thresholds(sorted_scores, counts, np.ones(3), level), np.full(3, want))
    world = _World(seed=3)
    cal = world.calibration(rng, 500)
    classwise = SplitConformal.fit(world.probs[cal], world.labels[cal], "lac", classwise=True)
    alpha, gamma, a = 0.1, 0.01, 0.1
    rows = world.target(rng, world.hard_mix(), 2000)
    labels = world.labels[rows]
    scores = conformity_scores(world.probs[rows], labels, "lac")
    misses = []
    for score, label in zip(scores, labels):
        if 0 < a < 1:
            err = int(misses_of(score, classwise.label_shift_quantiles(np.ones(world.k), a)[label]))
        else:  # the full set, or the empty one
            err = int(a >= 1)
        misses.append(err)
        a += gamma * (alpha - err)
    rate = np.mean(misses)
    assert abs(rate - alpha) <= (max(alpha, 1 - alpha) + gamma) / (gamma * len(rows))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 1], [1.0], 0.1), r"Expected `weights` to be 2 finite"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 1], [1.0, -1.0], 0.1), "Expected `weights`"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 1], [1.0, np.nan], 0.1), "Expected `weights`"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 1], [0.0, 0.0], 0.1), "not all 0"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 2], [1.0, 1.0], 0.1), "Expected `class_counts` to be K >= 2"),
        (lambda: label_shift_thresholds([0.1, 0.2], [2], [1.0], 0.1), "Expected `class_counts`"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1.0, 1.0], [1.0, 1.0], 0.1), "Expected `class_counts`"),
        (lambda: label_shift_thresholds([0.2, 0.1], [2, 0], [1.0, 1.0], 0.1), "Expected `sorted_scores` to be sorted"),
        (lambda: label_shift_thresholds([0.1, np.inf], [1, 1], [1.0, 1.0], 0.1), "Expected `scores`"),
        (lambda: label_shift_thresholds([0.1, 0.2], [1, 1], [1.0, 1.0], 1.0), r"Expected `alpha` to be in \(0, 1\)"),
        (lambda: label_shift_quantiles([0.1, 0.2], [0, 2], [1.0, 1.0], 0.1, 2), "labels"),
    ],
)
def test_malformed_inputs_are_refused_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_marginal_calibrator_has_no_labels_to_weight():
    probs = np.array([[0.7, 0.3], [0.4, 0.6], [0.2, 0.8]])
    marginal = SplitConformal.fit(probs, [0, 1, 1], "lac")
    with pytest.raises(ValueError, match="Expected `class_counts` to be the count of each class"):
        marginal.label_shift_quantiles([1.0, 1.0], 0.1)
    classwise = SplitConformal.fit(probs, [0, 1, 1], "lac", classwise=True)
    with pytest.raises(ValueError, match="probs have 3 classes but the calibrator was fitted on 2"):
        classwise.label_shift_sets(np.full((1, 3), 1 / 3), [1.0, 1.0], 0.1)
    assert classwise.label_shift_sets(probs, [1.0, 1.0], 0.5).dtype == bool


# --- coverage under a Dirichlet label shift -----------------------------------------------------------------------


class _World:
    """A calibrated model on a finite source population: logits z = g + b, g ~ N(0, 2^2 I), b rising from 0 to 3
    over the classes, labels drawn from softmax(z), which is then the posterior. Rare classes are the hard ones (a
    rare class is seldom predicted with confidence), so a label shift toward them lowers unweighted coverage.
    The population is the pool itself: calibration rows are drawn from it uniformly, target rows by drawing a
    class from pi_t and a row of that class, so p(x | y) is kept exactly and w = pi_t / (the pool's frequencies) is
    the true ratio."""

    def __init__(self, seed: int, n: int = 100_000, k: int = 10) -> None:
        rng = np.random.default_rng(seed)
        self.k = k
        self.probs = softmax(rng.normal(0, 2, (n, k)) + np.linspace(0, 3, k))
        self.labels = np.minimum((rng.random((n, 1)) > np.cumsum(self.probs, axis=1)).sum(axis=1), k - 1)
        self.priors = np.bincount(self.labels, minlength=k) / n
        self.rows = [np.flatnonzero(self.labels == c) for c in range(k)]

    def calibration(self, rng, n: int) -> np.ndarray:
        return rng.choice(len(self.labels), n, replace=False)

    def target(self, rng, priors, n: int) -> np.ndarray:
        classes = rng.choice(self.k, n, p=priors)
        counts = np.bincount(classes, minlength=self.k)
        picked = [self.rows[c][rng.integers(0, len(self.rows[c]), m)] for c, m in enumerate(counts)]
        return rng.permutation(np.concatenate(picked))

    def hard_mix(self) -> np.ndarray:
        """The priors turned around: the rare classes the common ones."""
        return self.priors[::-1].copy()


SPLITS, CAL_ROWS, TEST_ROWS, ALPHA = 200, 500, 1000, 0.1


@pytest.fixture(scope="module")
def shifted_coverage():
    """Over SPLITS random calibration splits, each with its own target priors pi_t ~ Dirichlet(1, ..., 1) (on
    average uniform, so the rare hard classes gain), the coverage of TEST_ROWS target rows of the sets at ALPHA:
    weighted by the true ratios, by EM's ratios from the same unlabelled rows, and unweighted."""
    world = _World(seed=0)
    rng = np.random.default_rng(1)
    rules = [("lac", {}, False, False), ("aps", {}, True, False), ("raps", {"k_reg": 2, "lam": 0.05}, False, True)]
    out = {(rule[0], weighting): [] for rule in rules for weighting in ("true", "em", "none")}
    for _ in range(SPLITS):
        pi_t = rng.dirichlet(np.ones(world.k))
        cal, test = world.calibration(rng, CAL_ROWS), world.target(rng, pi_t, TEST_ROWS)
        probs, labels = world.probs[test], world.labels[test]
        estimate = em_priors(probs, world.priors)
        weights = {"true": pi_t / world.priors, "em": np.array(estimate.weights), "none": np.ones(world.k)}
        for method, params, randomized, floor in rules:
            u_cal = rng.random(CAL_ROWS) if randomized else None
            fitted = SplitConformal.fit(
                world.probs[cal], world.labels[cal], method, u=u_cal, floor=floor, classwise=True, **params
            )
            u = rng.random(TEST_ROWS) if randomized else None
            for weighting, w in weights.items():
                sets = fitted.label_shift_sets(probs, w, ALPHA, u=u)
                out[(method, weighting)].append(sets[np.arange(TEST_ROWS), labels].mean())
    return {key: np.array(values) for key, values in out.items()}


def _bounds(coverages: np.ndarray, confidence: float = 0.999) -> tuple[float, float]:
    """A t interval for the mean coverage over splits: each split's coverage is one independent draw (its
    calibration rows, target priors and target rows), so the spread across splits carries every source of noise."""
    half = stats.t.ppf((1 + confidence) / 2, len(coverages) - 1) * coverages.std(ddof=1) / np.sqrt(len(coverages))
    return coverages.mean() - half, coverages.mean() + half


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_weighted_sets_cover_under_label_shift_where_unweighted_sets_miss(shifted_coverage, method):
    lower, _ = _bounds(shifted_coverage[(method, "true")])
    assert lower >= 1 - ALPHA - 0.01
    _, upper = _bounds(shifted_coverage[(method, "none")])
    assert upper < 1 - ALPHA - 0.01


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_em_weights_from_the_unlabelled_window_keep_the_coverage(shifted_coverage, method):
    lower, _ = _bounds(shifted_coverage[(method, "em")])
    assert lower >= 1 - ALPHA - 0.01
