"""Split conformal classification (calibkit.conformal): parity with MAPIE, coverage, p-values, edge cases.

Parity: MAPIE 1.6 is the reference, run on the same probabilities through a prefit "classifier" whose
``predict_proba`` returns its input. Where calibkit's definition differs from MAPIE's on purpose, a test below
shows the difference and says why.
"""

import json
import re

import numpy as np
import pytest
from mapie._machine_precision import EPSILON
from mapie.classification import SplitConformalClassifier
from mapie.conformity_scores.sets.aps import APSConformityScore
from mapie.conformity_scores.sets.lac import LACConformityScore
from mapie.conformity_scores.sets.raps import RAPSConformityScore
from mapie.utils import _compute_classification_quantile
from scipy import stats
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import StratifiedShuffleSplit

from calibkit import conformal
from calibkit.conformal import (
    SCORE_ATOL,
    SplitConformal,
    classwise_quantiles,
    conformal_quantile,
    conformity_scores,
    pick_k_reg,
    prediction_sets,
    quantile_rank,
    ranked_sets,
)
from calibkit.conformal.sets import _p_values_from_scores as p_values  # the functional form, an oracle
from calibkit.validation import check_probs

ALPHAS = (0.05, 0.1, 0.2)
#: (method, its parameters): RAPS with a penalty of 0.05 per rank past the second.
METHODS = [("lac", {}), ("aps", {}), ("raps", {"k_reg": 2, "lam": 0.05})]
METHOD_IDS = ["lac", "aps", "raps"]


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _draw_labels(rng, probs):
    """One label per row drawn from the row's probabilities, so the probabilities are calibrated."""
    labels = (rng.uniform(size=(len(probs), 1)) > np.cumsum(probs, axis=1)).sum(axis=1)
    return np.minimum(labels, probs.shape[1] - 1)


def calibrated(rng, n, n_classes=10):
    """A calibrated model's probabilities (softmax of Gaussian logits, sharper on some rows) and labels."""
    probs = _softmax(rng.uniform(0.3, 2.5, size=(n, 1)) * rng.normal(size=(n, n_classes)))
    return probs, _draw_labels(rng, probs)


def hundredths(rng, n, n_classes=5):
    """Probabilities in hundredths, none zero: ties within rows, and equal masses summed in different orders."""
    counts = 1 + rng.multinomial(100 - n_classes, rng.dirichlet(np.full(n_classes, 0.7), size=n))
    probs = counts / 100
    return probs, _draw_labels(rng, probs)


DATA = {"continuous": calibrated, "hundredths": hundredths}


@pytest.fixture(params=[None, 1, 3, "keys"], ids=["prefix-default", "prefix-1", "prefix-3", "key-ranking"])
def prefix_width(request, monkeypatch):
    """One-threshold sets of few classes read the top PREFIX_WIDTH + 1 labels first and sort the rows they do not
    settle whole; a prefix shorter than K = 5 or 6 sends rows down both paths (and tie groups across the prefix's
    end). "keys": the key ranking and block sums of many classes, taken at every width."""
    if request.param == "keys":
        monkeypatch.setattr("calibkit.conformal._ranking.RANK_MIN_CLASSES", 2)
    elif request.param is not None:
        monkeypatch.setattr("calibkit.conformal.sets.PREFIX_WIDTH", request.param)
    return request.param


class _Identity(ClassifierMixin, BaseEstimator):
    """A prefit classifier whose probabilities are its input."""

    def __init__(self, n_classes=3):
        self.n_classes = n_classes

    def fit(self, X, y=None):
        self.classes_ = np.arange(self.n_classes)
        return self

    def predict_proba(self, X):
        return np.asarray(X, dtype=np.float64)

    def predict(self, X):
        return np.argmax(X, axis=1)


def _mapie(method, probs, labels, seed):
    """MAPIE's split conformal classifier conformalized on (probs, labels) at every level of ALPHAS."""
    model = SplitConformalClassifier(
        _Identity(probs.shape[1]).fit(probs, labels),
        confidence_level=[1 - a for a in ALPHAS],
        conformity_score=method,
        prefit=True,
        random_state=seed,
    )
    return model.conformalize(probs, labels)


def _mapie_sets_at(method, probs, q, *, k_reg=0, lam=0.0, include_last_label=True, seed=0):
    """MAPIE's prediction sets at a given threshold (and, for RAPS, given k_star and lambda_star)."""
    score = {"lac": LACConformityScore, "aps": APSConformityScore, "raps": RAPSConformityScore}[method]()
    score.set_external_attributes(classes=np.arange(probs.shape[1]), random_state=seed)
    score.quantiles_ = np.array([q])
    if method == "raps":
        score.k_star, score.lambda_star = np.array([k_reg]), lam
    kwargs = {} if method == "lac" else {"include_last_label": include_last_label}
    sets = score.get_prediction_sets(probs[:, :, None].copy(), np.zeros((1, 1)), np.array([0.1]), cv="prefit", **kwargs)
    return sets[:, :, 0]


# --- parity with MAPIE --------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", DATA)
def test_lac_scores_quantiles_and_sets_equal_mapie(data):
    rng = np.random.default_rng(1)
    probs, labels = DATA[data](rng, 500, 6)
    test, _ = DATA[data](rng, 400, 6)
    model = _mapie("lac", probs, labels, seed=0)
    _, mapie_sets = model.predict_set(test)
    scores = conformity_scores(probs, labels, "lac")
    assert np.array_equal(scores, model.conformity_scores.ravel())
    for i, alpha in enumerate(ALPHAS):
        q = conformal_quantile(scores, alpha)
        assert q == model._mapie_classifier.quantiles_[i]
        assert np.array_equal(prediction_sets(test, q, "lac"), mapie_sets[:, :, i])


def test_aps_equals_mapie_which_randomizes_its_calibration_scores():
    """MAPIE's APS calibration scores are always randomized (``get_conformity_scores`` subtracts U p_y whatever
    ``include_last_label`` is), so its threshold is the quantile of randomized scores. Compared exactly: those
    scores against ``conformity_scores(..., "aps")`` with the same draws, the quantile, MAPIE's
    ``include_last_label=True`` sets against the non-randomized sets at that threshold, and its ``"randomized"``
    sets against the randomized sets with the same draws (MAPIE draws U with ``check_random_state(seed).uniform``, a
    fresh RandomState per call)."""
    rng = np.random.default_rng(2)
    probs, labels = calibrated(rng, 600, 8)
    test, _ = calibrated(rng, 500, 8)
    seed = 7
    model = _mapie("aps", probs, labels, seed)
    _, mapie_sets = model.predict_set(test)
    _, mapie_randomized = model.predict_set(test, conformity_score_params={"include_last_label": "randomized"})
    scores = conformity_scores(probs, labels, "aps", u=np.random.RandomState(seed))
    assert np.array_equal(scores, model.conformity_scores.ravel())
    for i, alpha in enumerate(ALPHAS):
        q = conformal_quantile(scores, alpha)
        assert q == model._mapie_classifier.quantiles_[i]
        assert np.array_equal(prediction_sets(test, q, "aps"), mapie_sets[:, :, i])
        randomized = prediction_sets(test, q, "aps", u=np.random.RandomState(seed))
        assert np.array_equal(randomized, mapie_randomized[:, :, i])


def test_raps_equals_mapie_with_the_k_reg_and_lambda_mapie_picked():
    """MAPIE's RAPS holds out a stratified 10% of the conformalization data (``StratifiedShuffleSplit`` with the
    same ``random_state``; ``size_raps`` is reset to None by the v1 class, hence sklearn's default 0.1) and picks
    ``k_star`` and ``lambda_star`` per alpha there. We replay the split, check that ``pick_k_reg`` on the held-out
    rows gives MAPIE's ``k_star``, then fix MAPIE's ``k_star`` and ``lambda_star`` in calibkit and compare the
    randomized scores, the quantiles and both kinds of sets exactly. (MAPIE's lambda search is not reproduced:
    it regularizes its search sets with ``k_star = lambda_``, see ``RAPSConformityScore._add_regularization``.)"""
    rng = np.random.default_rng(3)
    probs, labels = calibrated(rng, 700, 6)
    test, _ = calibrated(rng, 500, 6)
    seed = 11
    model = _mapie("raps", probs, labels, seed)
    _, mapie_sets = model.predict_set(test)
    _, mapie_randomized = model.predict_set(test, conformity_score_params={"include_last_label": "randomized"})
    mapie_score = model._mapie_classifier.conformity_score_function_
    kept, tuning = next(StratifiedShuffleSplit(n_splits=1, test_size=None, random_state=seed).split(probs, labels))
    assert len(model.conformity_scores) == len(kept)
    draws = np.random.RandomState(seed).uniform(size=len(kept))
    for i, alpha in enumerate(ALPHAS):
        k_reg, lam = int(mapie_score.k_star[i]), float(np.atleast_1d(mapie_score.lambda_star)[i])
        assert pick_k_reg(probs[tuning], labels[tuning], alpha) == k_reg
        scores = conformity_scores(probs[kept], labels[kept], "raps", k_reg=k_reg, lam=lam, u=draws)
        regularized = mapie_score._regularize_conformity_score(
            mapie_score.k_star, mapie_score.lambda_star, model.conformity_scores.copy(), mapie_score.cutoff
        )[:, 0, i]
        assert np.array_equal(scores, regularized)
        q = conformal_quantile(scores, alpha)
        assert q == model._mapie_classifier.quantiles_[i]
        assert np.array_equal(prediction_sets(test, q, "raps", k_reg=k_reg, lam=lam), mapie_sets[:, :, i])
        randomized = prediction_sets(test, q, "raps", k_reg=k_reg, lam=lam, u=np.random.RandomState(seed))
        assert np.array_equal(randomized, mapie_randomized[:, :, i])


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("k_reg, lam", [(0, 0.0), (1, 0.01), (2, 0.1), (4, 0.5)])
def test_non_randomized_sets_equal_mapie_include_last_label_at_a_shared_threshold(data, k_reg, lam, prefix_width):
    """APS (k_reg = 0, lam = 0) and RAPS sets at fixed thresholds, k_star and lambda_star, on continuous
    probabilities and on hundredths (ties within rows; masses equal in exact arithmetic summed in other orders,
    which both libraries compare with a 1e-8 tolerance)."""
    rng = np.random.default_rng(4)
    test, _ = DATA[data](rng, 800, 6)
    cal_probs, cal_labels = DATA[data](rng, 200, 6)
    method = "aps" if lam == 0 else "raps"
    params = {} if method == "aps" else {"k_reg": k_reg, "lam": lam}
    thresholds = list(np.quantile(conformity_scores(cal_probs, cal_labels, method, **params), [0.1, 0.5, 0.9, 1.0]))
    for q in thresholds + [0.35, 0.7, 0.95]:
        ours = prediction_sets(test, q, method, **params)
        assert np.array_equal(ours, _mapie_sets_at(method, test, q, k_reg=k_reg, lam=lam)), q
        assert ours.any(axis=1).all()  # never empty: the most probable labels are always in


def test_lac_sets_equal_mapie_at_thresholds_near_the_scores():
    """Thresholds equal to a score, and within 1e-8 of one either way, where the tolerance decides."""
    rng = np.random.default_rng(5)
    test, _ = hundredths(rng, 300, 5)
    for q in (0.8, 0.8 + 0.5e-8, 0.8 - 0.5e-8, 0.8 - 2e-8, 0.55, 0.99):
        assert np.array_equal(prediction_sets(test, q, "lac"), _mapie_sets_at("lac", test, q))


def test_randomized_raps_sets_equal_mapie_up_to_rank_k_reg_plus_one_and_differ_beyond_by_design():
    """MAPIE's randomized RAPS keeps the label that crosses q, at rank L, iff (E(L) - q) / D <= U + EPSILON with
    D = p_(L) - lam (L - k_reg)^+ + lam [L > k_reg], which is p_(L) only while L <= k_reg + 1. calibkit keeps it iff
    its randomized score E(L) - U p_(L) (the score its calibration uses, and MAPIE's too) is <= q: the set is
    {k : s(x, k, U) <= q}, which is what makes the coverage exact (see the Beta-law test). The sets agree on every
    row where L <= k_reg + 1; beyond, MAPIE's rule is reproduced here and differs from the score's own."""
    rng = np.random.default_rng(6)
    test, _ = calibrated(rng, 3000, 10)
    seed, k_reg, lam = 5, 2, 0.01
    for q in (0.5, 0.8, 0.95, 1.02):
        ours = prediction_sets(test, q, "raps", k_reg=k_reg, lam=lam, u=np.random.RandomState(seed))
        theirs = _mapie_sets_at("raps", test, q, k_reg=k_reg, lam=lam, include_last_label="randomized", seed=seed)
        crossing = prediction_sets(test, q, "raps", k_reg=k_reg, lam=lam).sum(axis=1)  # L: the non-randomized size
        assert np.array_equal(ours[crossing <= k_reg + 1], theirs[crossing <= k_reg + 1])
        # ours is the randomized score's own rule
        draws = np.random.RandomState(seed).uniform(size=len(test))
        every_label = np.stack(
            [
                conformity_scores(test, np.full(len(test), k), "raps", k_reg=k_reg, lam=lam, u=draws)
                for k in range(test.shape[1])
            ],
            axis=1,
        )
        assert np.array_equal(ours, every_label - q <= SCORE_ATOL)
        # MAPIE's is the formula above
        order = np.argsort(-test, axis=1)
        ranked = np.take_along_axis(test, order, axis=1)
        rows = np.arange(len(test))
        last = np.minimum(crossing, test.shape[1]) - 1
        mass = np.cumsum(ranked, axis=1)[rows, last] + lam * np.maximum(0, crossing - k_reg)
        denominator = ranked[rows, last] - lam * np.maximum(0, crossing - k_reg) + lam * (crossing > k_reg)
        keep = (mass - q) / denominator - draws <= EPSILON
        expected = prediction_sets(test, q, "raps", k_reg=k_reg, lam=lam)
        expected[rows, order[rows, last]] = keep
        assert np.array_equal(theirs, expected)
        if q >= 0.8:
            assert (ours != theirs).any()


@pytest.mark.parametrize("alpha", ALPHAS + (0.01, 0.25, 0.5))
def test_the_quantile_equals_mapie_for_every_calibration_size(alpha):
    rng = np.random.default_rng(7)
    for n in range(1, 400):
        scores = rng.uniform(size=n)
        ours = conformal_quantile(scores, alpha)
        if np.ceil((n + 1) * (1 - alpha)) > n:
            assert ours == np.inf  # every set is all classes; MAPIE refuses so few scores
            with pytest.raises(ValueError):
                _compute_classification_quantile(scores[:, None], np.array([alpha]))
        else:
            assert ours == _compute_classification_quantile(scores[:, None], np.array([alpha]))[0]


def test_the_quantile_rank_follows_alphas_decimal_value_where_mapie_follows_its_binary_rounding():
    """MAPIE computes ceil((n + 1) * (1 - alpha)) in floating point: for alpha = 0.059 and n = 999, 1 - alpha is a
    hair above 0.941 and the ceiling is 942. calibkit's rank is 941 = ceil(1000 * 0.941), the rank at which the
    p-values (1 + c) / 1000 cross alpha, so that {k : p_k > alpha} is the set. For 0.01, 0.05, 0.1, 0.2, 0.25 and
    0.5 the two agree for every n up to 20,000."""
    for alpha in (0.01, 0.05, 0.1, 0.2, 0.25, 0.5):
        assert all(quantile_rank(n, alpha) == np.ceil((n + 1) * (1 - alpha)) for n in range(1, 20_001)), alpha
    assert quantile_rank(999, 0.059) == 941
    assert int(np.ceil(1000 * (1 - 0.059))) == 942
    scores = np.arange(999) / 1000
    assert conformal_quantile(scores, 0.059) == 0.94
    assert _compute_classification_quantile(scores[:, None], np.array([0.059]))[0] == 0.941
    # LAC statistics 0.94 and 0.941 (the 941st and 942nd smallest scores): p-values 60 / 1000 and 59 / 1000
    probs = np.array([[0.06, 0.059, 0.881]])
    assert np.allclose(p_values(probs, scores, "lac")[0, :2], [0.06, 0.059])
    assert prediction_sets(probs, conformal_quantile(scores, 0.059), "lac")[0, :2].tolist() == [True, False]
    assert (p_values(probs, scores, "lac")[0, :2] > 0.059).tolist() == [True, False]


def test_tied_labels_share_one_randomized_score_where_mapie_follows_its_argsort():
    """With p = (0.4, 0.4, 0.2), MAPIE's APS score of label 0 or 1 depends on which one argsort puts first (the
    higher index, after its flip): 0.8 - 0.4 U for one, 0.4 - 0.4 U for the other. calibkit gives both the mass
    strictly above (0) plus their own probability, 0.4 - 0.4 U, so no score depends on a sort's tie order."""
    probs = np.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2]])
    labels = np.array([0, 1])
    draws = np.array([0.25, 0.25])
    ours = conformity_scores(probs, labels, "aps", u=draws)
    assert np.allclose(ours, [0.3, 0.3])
    cumsum, _ = APSConformityScore.get_true_label_cumsum_proba(labels, probs, np.arange(3))
    assert sorted(np.round(cumsum.ravel(), 6)) == [0.4, 0.8]


def test_zero_probability_labels_count_where_mapie_drops_them():
    """MAPIE replaces a last included probability <= 1e-8 by the row's smallest probability above it, so labels of
    probability 0 never enter its APS / RAPS sets. calibkit treats them like any other label: with p = (0.6, 0.4,
    0, 0), RAPS k_reg = 1, lam = 0.1, the zeros' score is 1.0 + 0.1 (4 - 1) = 1.3; at q = 1.3 a calibration example
    with that score is covered by calibkit's set and not by MAPIE's, which breaks the score/set correspondence the
    guarantee rests on."""
    probs = np.array([[0.6, 0.4, 0.0, 0.0]])
    score = conformity_scores(probs, [3], "raps", k_reg=1, lam=0.1)[0]
    assert score == pytest.approx(1.3)
    ours = prediction_sets(probs, score, "raps", k_reg=1, lam=0.1)
    assert ours.tolist() == [[True, True, True, True]]
    assert _mapie_sets_at("raps", probs, score, k_reg=1, lam=0.1).tolist() == [[True, True, False, False]]
    assert prediction_sets(probs, 1.2, "raps", k_reg=1, lam=0.1).tolist() == [[True, True, True, True]]
    assert prediction_sets(probs, 1.05, "raps", k_reg=1, lam=0.1).tolist() == [[True, True, False, False]]


# --- coverage on exchangeable data --------------------------------------------------------------------------


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
def test_randomized_coverage_given_the_calibration_set_follows_the_beta_law(method, params):
    """Split conformal with tie-free scores (LAC on continuous probabilities, randomized APS and RAPS) covers,
    given the calibration set, F(q) = U_(k) of n uniforms: Beta(n + 1 - l, l) with l = floor((n + 1) alpha), mean
    1 - l / (n + 1). Each of 400 splits draws a fresh calibration set of n = 200 from the same calibrated model
    (exchangeable with the test data); its coverage is measured on a fixed reference sample of 200,000 labelled
    test examples, whose labels are in the sets exactly when their scores are <= q (checked). The per-split
    coverages must pass a one-sample KS test against the Beta law (p > 0.001) and their mean must sit within four
    standard errors of 1 - l / (n + 1)."""
    rng = np.random.default_rng(8)
    n, alpha, splits = 200, 0.1, 400
    randomized = method != "lac"
    reference, reference_labels = calibrated(rng, 200_000, 10)
    reference_draws = rng.uniform(size=len(reference)) if randomized else None
    reference_scores = conformity_scores(reference, reference_labels, method, u=reference_draws, **params)
    q = conformal_quantile(
        conformity_scores(*calibrated(rng, n, 10), method, u=rng if randomized else None, **params), alpha
    )
    head = slice(0, 20_000)
    sets = prediction_sets(
        reference[head], q, method, u=None if reference_draws is None else reference_draws[head], **params
    )
    assert np.array_equal(sets[np.arange(20_000), reference_labels[head]], reference_scores[head] - q <= SCORE_ATOL)
    reference_scores.sort()
    coverages = np.empty(splits)
    for split in range(splits):
        probs, labels = calibrated(rng, n, 10)
        scores = conformity_scores(probs, labels, method, u=rng if randomized else None, **params)
        q = conformal_quantile(scores, alpha)
        coverages[split] = np.searchsorted(reference_scores, q + SCORE_ATOL, side="right") / len(reference_scores)
    low = int(np.floor((n + 1) * alpha))
    law = stats.beta(n + 1 - low, low)
    assert stats.kstest(coverages, law.cdf).pvalue > 1e-3
    standard_error = np.sqrt(law.var() / splits + alpha * (1 - alpha) / len(reference_scores))
    assert abs(coverages.mean() - law.mean()) < 4 * standard_error
    assert law.mean() == pytest.approx(1 - low / (n + 1))


@pytest.mark.parametrize("method, params", METHODS[1:], ids=METHOD_IDS[1:])
@pytest.mark.parametrize("randomized_scores", [False, True], ids=["plain-scores", "randomized-scores"])
def test_non_randomized_sets_cover_at_least_one_minus_alpha(method, params, randomized_scores):
    """The non-randomized APS / RAPS sets (the crossing label included) cover at least 1 - alpha, whether the
    calibration scores are randomized (MAPIE's default pairing) or not; over 200 splits the mean coverage is
    above 1 - alpha less three standard errors, and above the randomized sets' exact 1 - l / (n + 1)."""
    rng = np.random.default_rng(9)
    n, alpha, splits = 200, 0.1, 200
    coverages = np.empty(splits)
    for split in range(splits):
        probs, labels = calibrated(rng, n, 10)
        test, test_labels = calibrated(rng, 1000, 10)
        scores = conformity_scores(probs, labels, method, u=rng if randomized_scores else None, **params)
        sets = prediction_sets(test, conformal_quantile(scores, alpha), method, **params)
        coverages[split] = sets[np.arange(len(test)), test_labels].mean()
    standard_error = coverages.std(ddof=1) / np.sqrt(splits)
    assert coverages.mean() > 1 - alpha - 3 * standard_error
    assert coverages.mean() > 1 - np.floor((n + 1) * alpha) / (n + 1)


def _skewed(rng, n):
    """A calibrated model over four classes of decreasing prior: class 3 is rare and rarely confident."""
    probs = _softmax(np.array([1.0, 0.5, 0.0, -1.0]) + 1.5 * rng.normal(size=(n, 4)))
    return probs, _draw_labels(rng, probs)


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
def test_mondrian_sets_cover_every_class(method, params):
    """Class-conditional quantiles cover each class at 1 - alpha (mean over 100 splits, within three standard
    errors), including the rare class 3 (about 10% of the labels). Marginal LAC, for contrast, covers class 3 far
    less (about 0.71 for 0.9): its sets are smallest on average by leaving the hard class out."""
    rng = np.random.default_rng(10)
    alpha, splits = 0.1, 100
    per_class = np.empty((splits, 4))
    marginal_lac_rare = np.empty(splits)
    for split in range(splits):
        probs, labels = _skewed(rng, 1000)
        test, test_labels = _skewed(rng, 4000)
        scores = conformity_scores(probs, labels, method, **params)
        hits = prediction_sets(test, classwise_quantiles(scores, labels, alpha, 4), method, **params)
        hits = hits[np.arange(len(test)), test_labels]
        per_class[split] = [hits[test_labels == k].mean() for k in range(4)]
        if method == "lac":
            marginal = prediction_sets(test, conformal_quantile(scores, alpha), "lac")
            marginal_lac_rare[split] = marginal[np.arange(len(test)), test_labels][test_labels == 3].mean()
    standard_error = per_class.std(axis=0, ddof=1) / np.sqrt(splits)
    assert (per_class.mean(axis=0) > 1 - alpha - 3 * standard_error).all(), per_class.mean(axis=0)
    if method == "lac":
        assert marginal_lac_rare.mean() < 1 - alpha - 0.1


def _noisy_tail(rng, n, n_classes=100):
    """A model whose top class is usually right but whose 100 probabilities carry noise in the tail: logits
    N(0, 1) with the class of the example boosted by U(2.5, 7); the label is that class 96% of the time."""
    boosted = rng.integers(0, n_classes, size=n)
    logits = rng.normal(size=(n, n_classes))
    logits[np.arange(n), boosted] += rng.uniform(2.5, 7.0, size=n)
    labels = np.where(rng.uniform(size=n) < 0.96, boosted, rng.integers(0, n_classes, size=n))
    return _softmax(logits), labels


def test_raps_sets_are_smaller_than_aps_at_the_same_coverage_when_the_tail_is_noise():
    """Angelopoulos et al.'s point (Sec. 2.3, Table 1): APS adds labels until their mass reaches q, so noisy tail
    probabilities make its sets large; RAPS, with k_reg picked on a tuning split and lam = 0.1, stops after a few
    ranks. Both are randomized, so both cover 1 - l / (n + 1) exactly in expectation; over 10 splits the mean
    coverages agree within 0.01 and RAPS's mean size is less than half of APS's (about 3.7 against 11)."""
    rng = np.random.default_rng(11)
    alpha = 0.1
    size, coverage = {"aps": [], "raps": []}, {"aps": [], "raps": []}
    for _ in range(10):
        k_reg = pick_k_reg(*_noisy_tail(rng, 500), alpha)
        probs, labels = _noisy_tail(rng, 1000)
        test, test_labels = _noisy_tail(rng, 2000)
        for method, params in (("aps", {}), ("raps", {"k_reg": k_reg, "lam": 0.1})):
            q = conformal_quantile(conformity_scores(probs, labels, method, u=rng, **params), alpha)
            sets = prediction_sets(test, q, method, u=rng, **params)
            size[method].append(sets.sum(axis=1).mean())
            coverage[method].append(sets[np.arange(len(test)), test_labels].mean())
    assert abs(np.mean(coverage["raps"]) - np.mean(coverage["aps"])) < 0.01
    assert abs(np.mean(coverage["raps"]) - (1 - alpha)) < 0.01
    assert np.mean(size["raps"]) < 0.5 * np.mean(size["aps"])


# --- p-values: level sets and nesting -----------------------------------------------------------------------


def _alphas_around(ns, rng):
    """Every alpha at which some rank switches (j / (n + 1)), a hair either side, and random ones."""
    grid = np.concatenate([np.arange(1, n + 1) / (n + 1) for n in ns if n > 0])
    grid = np.concatenate([grid, np.nextafter(grid, 0), np.nextafter(grid, 1), rng.uniform(size=50), [1e-3, 0.999]])
    return np.unique(grid[(grid > 0) & (grid < 1)])[::-1]


#: plain: non-randomized scores, sets and p-values; randomized: all randomized; mixed: randomized calibration scores
#: (some draws exactly 1, so some scores are exactly 0) with non-randomized sets, MAPIE's default pairing.
CASES = [(m, p, mode) for m, p in METHODS for mode in ("plain", "randomized", "mixed") if m != "lac" or mode == "plain"]


@pytest.mark.parametrize("method, params, mode", CASES, ids=[f"{m}-{mode}" for m, _, mode in CASES])
@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("classwise", [False, True], ids=["marginal", "mondrian"])
def test_p_value_level_sets_are_the_sets_at_every_alpha_and_are_nested(
    method, params, mode, data, classwise, prefix_width
):
    rng = np.random.default_rng(12)
    probs, labels = DATA[data](rng, 40, 5)
    test, _ = DATA[data](rng, 300, 5)
    calibration_draws = None if mode == "plain" else np.where(rng.uniform(size=40) < 0.2, 1.0, rng.uniform(size=40))
    draws = rng.uniform(size=len(test)) if mode == "randomized" else None
    scores = conformity_scores(probs, labels, method, u=calibration_draws, **params)
    if mode == "mixed":
        assert (scores == 0).any()
    calibration_labels = labels if classwise else None
    pv = p_values(test, scores, method, u=draws, calibration_labels=calibration_labels, **params)
    assert ((pv >= 1 / (len(scores) + 1)) & (pv <= 1)).all()
    ns = np.bincount(labels, minlength=5) if classwise else [len(scores)]
    previous = np.zeros(test.shape, dtype=bool)
    for alpha in _alphas_around(ns, rng):  # decreasing: the sets can only grow
        q = classwise_quantiles(scores, labels, alpha, 5) if classwise else conformal_quantile(scores, alpha)
        sets = prediction_sets(test, q, method, u=draws, **params)
        assert np.array_equal(pv > alpha, sets), alpha
        assert (sets >= previous).all(), alpha
        previous = sets
    assert previous.all()  # at alpha < 1 / (n + 1) every class is in


def test_p_value_counts_find_the_exact_floating_point_boundary():
    """Scores a few ulps either side of t -/+ SCORE_ATOL, repeated, and t as a batch (N, K): the counts behind the
    p-values equal a brute-force count with the very comparisons the sets make; no scores count nothing."""
    rng = np.random.default_rng(13)
    t = rng.uniform(0, 3, size=200)
    offsets = np.concatenate([np.zeros(1), [SCORE_ATOL, -SCORE_ATOL]])
    scores = np.concatenate(
        [t + d + k * np.spacing(t) for d in offsets for k in range(-3, 4)] + [rng.uniform(0, 3, size=500)]
    )
    scores = np.concatenate([scores, scores[::7]])
    sorted_scores = np.sort(scores)
    batch = t.reshape(20, 10)
    assert np.array_equal(
        conformal._count_at_or_above(sorted_scores, batch, strict=False),
        (batch[..., None] - scores <= SCORE_ATOL).sum(axis=-1),
    )
    assert np.array_equal(
        conformal._count_at_or_above(sorted_scores, batch, strict=True),
        (batch[..., None] - scores < -SCORE_ATOL).sum(axis=-1),
    )
    assert not conformal._count_at_or_above(np.empty(0), batch, strict=False).any()


@pytest.mark.parametrize("method, params", METHODS[1:], ids=METHOD_IDS[1:])
@pytest.mark.parametrize("data", DATA)
def test_one_threshold_and_the_same_threshold_per_class_give_the_same_sets(method, params, data, prefix_width):
    """The batch path (a prefix of top labels, then a sort of the rows it leaves) and the per-class path (label
    ranks), at calibration scores, between them and at +inf."""
    rng = np.random.default_rng(14)
    probs, labels = DATA[data](rng, 100, 6)
    test, _ = DATA[data](rng, 400, 6)
    draws = rng.uniform(size=len(test))
    for u in (None, draws):
        scores = conformity_scores(probs, labels, method, u=None if u is None else rng, **params)
        for q in list(scores[:30]) + [0.0, 0.5, 1.0, 1.5, np.inf]:
            one = prediction_sets(test, q, method, u=u, **params)
            assert np.array_equal(one, prediction_sets(test, np.full(6, q), method, u=u, **params)), q


@pytest.mark.parametrize("randomized", [False, True], ids=["plain", "randomized"])
def test_sets_reaching_past_the_prefix_fall_back_to_the_whole_row(randomized):
    """At K = 100 with flat rows, many APS sets hold more than PREFIX_WIDTH labels."""
    rng = np.random.default_rng(20)
    test = _softmax(rng.uniform(0, 1.5, size=(400, 1)) * rng.normal(size=(400, 100)))
    test[:50] = np.round(test[:50], 3)  # ties, some across the prefix's end
    test[:50] /= test[:50].sum(axis=1, keepdims=True)
    draws = rng.uniform(size=len(test)) if randomized else None
    for q in (0.5, 0.9, 0.99):
        for method, params in (("aps", {}), ("raps", {"k_reg": 5, "lam": 0.002})):
            one = prediction_sets(test, q, method, u=draws, **params)
            assert np.array_equal(one, prediction_sets(test, np.full(100, q), method, u=draws, **params))
            if q == 0.99:
                assert (one.sum(axis=1) > conformal.sets.PREFIX_WIDTH + 1).any()


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("n_classes", [6, 100])
def test_ranked_sets_are_the_sets_as_prefixes_of_the_stable_ranking(method, params, data, n_classes):
    """Each row's set is the first ``size`` labels of its stable ranking, the same set as ``prediction_sets``'s, at
    calibration scores, between them and at +-inf; with rounded rows, whose ties go down the sets' own path."""
    rng = np.random.default_rng(21)
    probs, labels = DATA[data](rng, 100, n_classes)
    test, _ = DATA[data](rng, 300, n_classes)
    draws = rng.uniform(size=len(test))
    for u in (None,) if method == "lac" else (None, draws):
        scores = conformity_scores(probs, labels, method, u=None if u is None else rng, **params)
        for q in list(scores[:20]) + [0.0, 0.5, 1.0, 1.5, np.inf, -np.inf]:
            order, sizes = ranked_sets(test, q, method, u=u, **params)
            assert np.array_equal(order, np.argsort(-test, axis=1, kind="stable"))
            inside = np.zeros(test.shape, dtype=bool)
            np.put_along_axis(inside, order, np.arange(n_classes) < sizes[:, None], axis=1)
            assert np.array_equal(inside, prediction_sets(test, q, method, u=u, **params)), q
            unchecked = ranked_sets(test, float(q), method, u=u, check_input=False, **params)
            assert np.array_equal(unchecked[0], order) and np.array_equal(unchecked[1], sizes)


def test_ranked_sets_refuse_a_threshold_per_class():
    with pytest.raises(ValueError, match="Expected `threshold` to be one number"):
        ranked_sets(np.full((2, 3), 1 / 3), np.full(3, 0.5), "lac")


# --- the fitted calibrator ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("classwise", [False, True], ids=["marginal", "mondrian"])
def test_the_calibrator_applies_the_free_functions_and_round_trips_through_json(method, params, classwise):
    rng = np.random.default_rng(15)
    probs, labels = calibrated(rng, 300, 7)
    test, _ = calibrated(rng, 100, 7)
    draws = rng.uniform(size=len(probs)) if method != "lac" else None
    fitted = SplitConformal.fit(probs, labels, method, u=draws, classwise=classwise, **params)
    scores = conformity_scores(probs, labels, method, u=draws, **params)
    assert fitted.randomized == (draws is not None) and fitted.classwise == classwise
    restored = SplitConformal.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert np.array_equal(restored.scores, fitted.scores) and restored.scores.dtype == np.float64
    for alpha in ALPHAS:
        q = classwise_quantiles(scores, labels, alpha, 7) if classwise else conformal_quantile(scores, alpha)
        assert np.array_equal(fitted.quantile(alpha), q) and np.array_equal(restored.quantile(alpha), q)
        assert np.array_equal(fitted.sets(test, alpha), prediction_sets(test, q, method, **params))
        assert np.array_equal(restored.sets(test, alpha), fitted.sets(test, alpha))
    expected = p_values(test, scores, method, calibration_labels=labels if classwise else None, **params)
    assert np.array_equal(fitted.p_values(test), expected)
    with pytest.raises(ValueError, match="read-only"):
        fitted.scores[0] = 0.0


def test_the_calibrator_refuses_probabilities_of_another_width():
    fitted = SplitConformal.fit(*calibrated(np.random.default_rng(16), 50, 4), "lac")
    with pytest.raises(ValueError, match="probs have 5 classes but the calibrator was fitted on 4"):
        fitted.sets(np.full((2, 5), 0.2), 0.1)


# --- edge cases ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
def test_too_few_calibration_scores_give_every_class(method, params):
    rng = np.random.default_rng(17)
    probs, labels = calibrated(rng, 8, 5)  # (8 + 1) * 0.9 > 8
    scores = conformity_scores(probs, labels, method, **params)
    assert conformal_quantile(scores, 0.1) == np.inf and quantile_rank(8, 0.1) == 9
    test, _ = calibrated(rng, 20, 5)
    assert prediction_sets(test, np.inf, method, **params).all()
    if method != "lac":
        assert prediction_sets(test, np.inf, method, u=rng, **params).all()
    assert (p_values(test, scores, method, **params) > 0.1).all()
    assert (classwise_quantiles(scores, labels, 0.1, 5) == np.inf).all()


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
def test_binary_problems_may_be_given_as_one_column(method, params):
    rng = np.random.default_rng(18)
    positive = rng.uniform(size=200)
    labels = (rng.uniform(size=200) < positive).astype(int)
    two_columns = np.stack([1 - positive, positive], axis=1)
    assert np.array_equal(
        conformity_scores(positive, labels, method, **params), conformity_scores(two_columns, labels, method, **params)
    )
    q = conformal_quantile(conformity_scores(positive, labels, method, **params), 0.2)
    sets = prediction_sets(positive, q, method, **params)
    assert sets.shape == (200, 2) and np.array_equal(sets, prediction_sets(two_columns, q, method, **params))


def test_aps_with_ties_treats_tied_labels_together():
    probs = np.array([[0.3, 0.3, 0.3, 0.1]])
    assert prediction_sets(probs, 0.2, "aps").tolist() == [[True, True, True, False]]
    assert prediction_sets(probs, 0.95, "aps").tolist() == [[True, True, True, True]]
    assert prediction_sets(probs, 0.2, "aps", u=[0.0]).tolist() == [[False, False, False, False]]
    assert prediction_sets(probs, 0.3, "aps", u=[0.0]).tolist() == [[True, True, True, False]]
    assert np.allclose(conformity_scores(np.repeat(probs, 4, axis=0), [0, 1, 2, 3], "aps"), [0.3, 0.3, 0.3, 1.0])
    assert conformity_scores(probs, [1], "raps", k_reg=1, lam=0.1)[0] == pytest.approx(0.3 + 0.1 * 2)


def test_pick_k_reg_is_the_finite_sample_quantile_of_the_true_rank():
    probs = np.array([[0.5, 0.3, 0.2]] * 10)
    labels = np.array([0] * 6 + [1] * 3 + [2])
    assert pick_k_reg(probs, labels, 0.5) == 1  # ceil(11 * 0.5) = 6th smallest rank
    assert pick_k_reg(probs, labels, 0.2) == 2  # 9th
    assert pick_k_reg(probs, labels, 0.05) == 3  # +inf, capped at K


def test_randomness_comes_only_from_u():
    rng_probs, rng_labels = calibrated(np.random.default_rng(19), 50, 4)
    by_generator = conformity_scores(rng_probs, rng_labels, "aps", u=np.random.default_rng(3))
    by_draws = conformity_scores(rng_probs, rng_labels, "aps", u=np.random.default_rng(3).uniform(size=50))
    assert np.array_equal(by_generator, by_draws)
    assert np.array_equal(
        conformity_scores(rng_probs, rng_labels, "aps", u=np.zeros(50)), conformity_scores(rng_probs, rng_labels, "aps")
    )


def test_rows_that_do_not_sum_to_one_are_refused():
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        prediction_sets(np.array([[0.5, 0.3, 0.1]]), 0.5, "aps")
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        conformity_scores(np.array([[0.2, 0.2, 0.2]]), [0], "lac")


@pytest.mark.parametrize(
    "probs",
    [
        np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]),
        np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]], dtype=np.float32),
        np.array([[1.00005, -0.00005], [0.5, 0.5]]),
        np.array([[0.6, 0.3, 0.1], [0.2, 0.5, np.nan]]),
        np.array([[0.6, 0.4, np.inf]]),
        np.array([[0.6, 0.3, 0.2]]),
        np.array([[1.5, -0.5]]),
        np.array([0.2, 0.9]),
        np.array([[1, 0], [0, 1]]),
        [[0.5, 0.5]],
        np.empty((0, 3)),
    ],
)
def test_the_quick_probability_check_returns_or_refuses_what_check_probs_does(probs):
    try:
        expected = check_probs(probs)
    except ValueError as error:
        with pytest.raises(ValueError, match=re.escape(str(error))):
            conformal._check_probs(probs)
        return
    got = conformal._check_probs(probs)
    assert got.dtype == np.float64 and np.array_equal(got, expected)


PROBS = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]])


@pytest.mark.parametrize(
    "call, name, shown",
    [
        (lambda: conformal_quantile([0.1, 0.2], 0.0), "alpha", "0.0"),
        (lambda: conformal_quantile([0.1, 0.2], 1.0), "alpha", "1.0"),
        (lambda: conformal_quantile([0.1, 0.2], float("nan")), "alpha", "nan"),
        (lambda: conformal_quantile([0.1, 0.2], "0.1x"), "alpha", "'0.1x'"),
        (lambda: quantile_rank(0, 0.1), "n", "0"),
        (lambda: quantile_rank(True, 0.1), "n", "True"),
        (lambda: conformal_quantile([], 0.1), "scores", "an array of shape (0,)"),
        (lambda: conformal_quantile([0.1, np.nan], 0.1), "scores", "an array of shape (2,) starting [0.1, nan]"),
        (lambda: conformity_scores(PROBS, [0, 1], "thr"), "method", "'thr'"),
        (lambda: conformity_scores(PROBS, [0, 1], "raps", k_reg=-1, lam=0.1), "k_reg", "-1"),
        (lambda: conformity_scores(PROBS, [0, 1], "raps", k_reg=1.5, lam=0.1), "k_reg", "1.5"),
        (lambda: conformity_scores(PROBS, [0, 1], "raps", k_reg=1, lam=-0.1), "lam", "-0.1"),
        (lambda: conformity_scores(PROBS, [0, 1], "raps", k_reg=1, lam=float("inf")), "lam", "inf"),
        (lambda: conformity_scores(PROBS, [0, 1], "aps", lam=0.1), "lam", "0.1"),
        (lambda: conformity_scores(PROBS, [0, 1], "lac", k_reg=2), "k_reg", "2"),
        (
            lambda: conformity_scores(PROBS, [0, 1], "lac", u=[0.5, 0.5]),
            "u",
            "an array of shape (2,) starting [0.5, 0.5]",
        ),
        (lambda: conformity_scores(PROBS, [0, 1], "aps", u=[0.5]), "u", "an array of shape (1,) starting [0.5]"),
        (
            lambda: conformity_scores(PROBS, [0, 1], "aps", u=[0.5, 1.5]),
            "u",
            "an array of shape (2,) starting [0.5, 1.5]",
        ),
        (lambda: prediction_sets(PROBS, float("nan"), "lac"), "threshold", "nan"),
        (lambda: prediction_sets(PROBS, [0.5, 0.5], "lac"), "threshold", "an array of shape (2,) starting [0.5, 0.5]"),
        (lambda: classwise_quantiles([0.1], [0], 0.1, 1), "n_classes", "1"),
        (lambda: pick_k_reg(PROBS, [0, 1], 1.5), "alpha", "1.5"),
        (lambda: SplitConformal("lac", np.array([0.2, 0.1]), 3), "scores", "but they are not"),
        (lambda: SplitConformal("lac", np.array([0.1, 0.2]), 1), "n_classes", "1"),
        (lambda: SplitConformal("lac", np.array([0.1, 0.2]), 2, randomized="no"), "randomized", "'no'"),
        (
            lambda: SplitConformal("lac", np.array([0.1, 0.2]), 2, class_counts=np.array([1, 2])),
            "class_counts",
            "[1, 2]",
        ),
        (lambda: SplitConformal.from_dict({"method": "lac"}), "data", "['method']"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_refusals_name_the_parameter_and_the_value(call, name, shown):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert message.startswith(f"Expected `{name}` to be "), message
    assert message.endswith(shown) or shown in message, message


def test_calibration_labels_are_named_when_malformed():
    with pytest.raises(ValueError, match="calibration_labels: labels has 1 entries"):
        p_values(PROBS, [0.1, 0.2], "lac", calibration_labels=[0])


def _adversarial_rows(rng, n_classes):
    """Flat rows, ties in hundredths, zeros, and peaked rows, with thresholds at and around their cumulative masses."""
    flat = np.full((4, n_classes), 1.0 / n_classes)
    counts = 1 + rng.multinomial(1000 - n_classes, rng.dirichlet(np.full(n_classes, 0.3)), size=8)
    sparse = rng.dirichlet(np.full(n_classes, 0.05), size=8)
    sparse[sparse < 1e-6] = 0.0
    peaked = _softmax(rng.normal(size=(8, n_classes)) + 12.0 * (np.arange(n_classes) == 3))
    probs = np.concatenate([flat, counts / 1000, sparse / sparse.sum(axis=1, keepdims=True), peaked])
    masses = np.cumsum(-np.sort(-probs, axis=1), axis=1)
    at = masses[:, [0, 1, 5, n_classes // 2, n_classes - 2, n_classes - 1]].ravel()
    return probs, np.concatenate([at, at - SCORE_ATOL, at + SCORE_ATOL, [0.0, 0.5, 0.9, 1.0, 1.3]])


def _ranked_both_ways(monkeypatch, probs, q, method, u, params):
    """(sets, order, sizes) by the key ranking (every width of at least 2 classes) and by the float sort."""
    out = []
    for minimum in (2, 10**9):
        monkeypatch.setattr("calibkit.conformal._ranking.RANK_MIN_CLASSES", minimum)
        out.append((prediction_sets(probs, q, method, u=u, **params), *ranked_sets(probs, q, method, u=u, **params)))
    return out


@pytest.mark.parametrize(
    "method, params, randomized",
    [("lac", {}, False)] + [(m, p, r) for m, p in [("aps", {}), ("raps", {"k_reg": 2, "lam": 0.05})] for r in (0, 1)],
    ids=["lac", "aps", "aps-randomized", "raps", "raps-randomized"],
)
def test_key_ranked_sets_equal_the_float_sorted_rows_on_flat_tied_and_peaked_rows(
    method, params, randomized, monkeypatch
):
    """Rows of many classes are ranked by integer keys and their sizes found from block sums; a row with ties or
    near-ties, or a mass too close to the threshold to tell, is sorted as floats. Either way the sets, the stable
    ranking and the sizes are those of the float sort, at thresholds equal to the cumulative masses and one
    SCORE_ATOL either side of them, for widths below, at and past a block."""
    rng = np.random.default_rng(11)
    for n_classes in (6, 32, 70, 300):
        probs, thresholds = _adversarial_rows(rng, n_classes)
        u = rng.uniform(size=len(probs)) if randomized else None
        for q in thresholds:
            q = float(q) + params.get("lam", 0.0) * 3
            keyed, floated = _ranked_both_ways(monkeypatch, probs, q, method, u, params)
            for a, b in zip(keyed, floated):
                assert np.array_equal(a, b), (n_classes, q)


@pytest.mark.parametrize("randomized", [False, True], ids=["non-randomized", "randomized"])
@pytest.mark.parametrize("method, params", [("aps", {}), ("raps", {"k_reg": 3, "lam": 0.02})], ids=["aps", "raps"])
def test_key_ranked_sets_of_tiny_near_tied_and_float32_probabilities_and_strided_batches_equal_the_float_sort(
    method, params, randomized, monkeypatch
):
    """Zeros, -0.0, subnormals and probabilities one ulp apart (which share their keys' leading bits), float32 rows
    (whose truncated keys are exact), and batches that are not C-contiguous (a Fortran-ordered copy, every other
    column of a wider array) are ranked and their sets sized as the float sort does."""
    rng = np.random.default_rng(23)
    probs = _softmax(rng.normal(size=(12, 200)) * 3)
    probs[:, :40] = rng.choice([0.0, -0.0, 1e-300, 5e-324, 2.0**-31, 2.0**-30, 1.25 * 2.0**-30], size=(12, 40))
    probs[::3, 50] = np.nextafter(probs[::3, 51], 1.0)
    probs /= probs.sum(axis=1, keepdims=True)
    wide = np.zeros((12, 400))
    wide[:, ::2] = probs
    single = _softmax(rng.normal(size=(12, 200)) * 3).astype(np.float32)
    u = rng.uniform(size=len(probs)) if randomized else None
    for batch in (probs, np.asfortranarray(probs), wide[:, ::2], single):
        masses = np.cumsum(-np.sort(-batch.astype(np.float64), axis=1), axis=1)
        for q in np.concatenate([masses[:, [0, 20, 150, 170]].ravel(), [0.5, 0.99, 1.0, np.inf, -np.inf]]):
            q = float(q) + params.get("lam", 0.0) * 5
            keyed, floated = _ranked_both_ways(monkeypatch, batch, q, method, u, params)
            for a, b in zip(keyed, floated):
                assert np.array_equal(a, b), q


def test_the_key_ranking_is_stable_without_near_ties_or_negative_zeros_and_knows_its_first_tie():
    """Rows with two probabilities one ulp apart or a -0.0 are not stable (their key order may not be the stable
    one); the others are, ties included, and their order is the stable ranking. A randomized size is the ranking's
    own only before the row's first tie."""
    rng = np.random.default_rng(4)
    probs = _softmax(rng.normal(size=(5, 100)))
    probs[1, 7] = probs[1, 9]
    probs[2, 7] = np.nextafter(probs[2, 9], 1.0)
    probs[3, 7] = -0.0
    ranking = conformal._KeyRanking(probs)
    assert ranking.stable.tolist() == [True, True, False, False, True]
    assert np.array_equal(ranking.order[ranking.stable], np.argsort(-probs, axis=1, kind="stable")[ranking.stable])
    # the tie of row 1 is at ranks r + 1 and r + 2: randomized sizes up to r are its own, others not
    r = int(np.flatnonzero(np.sort(probs[1])[::-1] == probs[1, 9])[0])
    assert ranking.singles[[0, 1, 4]].tolist() == [100, r, 100]
    settles = ranking.settles(np.array([99, r, 0, 0, 100]), randomized=True)
    assert settles.tolist() == [True, True, False, False, True]
    assert not ranking.settles(np.full(5, r + 1), randomized=True)[1] and ranking.settles(np.full(5, r + 1), False)[1]


def test_block_sizes_settle_rows_away_from_the_threshold_and_leave_the_rest_to_the_float_sort():
    """A threshold at a row's exact cumulative mass plus SCORE_ATOL cannot be told from the block sums: that row
    is left unsettled (and sorted as floats by the caller); the other rows are settled, at their true sizes."""
    rng = np.random.default_rng(5)
    probs = _softmax(rng.normal(size=(6, 200)) * 2)
    q = float(np.cumsum(-np.sort(-probs[0]))[39]) + SCORE_ATOL
    ranking = conformal._KeyRanking(probs)
    sizes, settled = conformal._block_sizes(ranking.values, 200, q, 0, 0.0, None)
    assert not settled[0] and settled[1:].all()
    assert np.array_equal(sizes[1:], prediction_sets(probs[1:], q, "aps").sum(axis=1))


# --- the floor sets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
def test_floor_sets_cover_at_least_one_minus_alpha_are_never_empty_and_smaller_than_mapies_non_randomized(
    method, params
):
    """Over 200 calibration splits of a calibrated model: the floor sets hold the most probable label in every row,
    cover at least 1 - alpha on average (within three standard errors, and at least the top-1 accuracy), and for
    APS and RAPS are on average no larger than the non-randomized (MAPIE include_last_label=True) sets calibrated
    on their own scores, which have the same guarantee."""
    rng = np.random.default_rng(31)
    n, alpha, splits = 200, 0.1, 200
    coverages, sizes, mapie_sizes, accuracies = (np.empty(splits) for _ in range(4))
    for split in range(splits):
        probs, labels = calibrated(rng, n, 10)
        test, test_labels = calibrated(rng, 1000, 10)
        floor = SplitConformal.fit(probs, labels, method, floor=True, **params)
        sets = floor.sets(test, alpha)
        assert sets[np.arange(len(test)), test.argmax(axis=1)].all()
        coverages[split] = sets[np.arange(len(test)), test_labels].mean()
        accuracies[split] = (test.argmax(axis=1) == test_labels).mean()
        sizes[split] = sets.sum(axis=1).mean()
        if method != "lac":
            mapie = SplitConformal.fit(probs, labels, method, **params).sets(test, alpha)
            mapie_sizes[split] = mapie.sum(axis=1).mean()
    standard_error = coverages.std(ddof=1) / np.sqrt(splits)
    assert coverages.mean() > 1 - alpha - 3 * standard_error
    assert np.all(coverages >= accuracies)
    if method != "lac":
        assert sizes.mean() <= mapie_sizes.mean()


@pytest.mark.parametrize("method, params", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("n_classes", [5, 70], ids=["few-classes", "key-ranking"])
def test_floor_scores_sets_ranked_sets_and_p_values_agree(method, params, n_classes):
    """The floor score is 0 for the most probable labels and the u = 1 score (or LAC's) otherwise; the sets at a
    threshold are {k : score <= q}, the ranked sets list them, and the p-values' level sets are the sets."""
    rng = np.random.default_rng(32)
    probs, labels = calibrated(rng, 300, n_classes)
    probs[:20] = hundredths(rng, 20, n_classes)[0] if n_classes == 5 else probs[:20]  # ties, at the top too
    scores = conformal.floor_scores(probs, labels, method, **params)
    top = probs[np.arange(len(labels)), labels] == probs.max(axis=1)
    assert np.all(scores[top] == 0)
    plain = conformity_scores(
        probs, labels, method, **({"u": np.ones(len(labels))} if method != "lac" else {}), **params
    )
    np.testing.assert_array_equal(scores[~top], plain[~top])
    test = calibrated(rng, 80, n_classes)[0]
    for q in (0.0, *np.quantile(scores, [0.5, 0.8, 0.9, 0.97])):
        sets = prediction_sets(test, q, method, floor=True, **params)
        assert sets.sum(axis=1).min() >= 1
        order, sizes = ranked_sets(test, q, method, floor=True, **params)
        listed = np.zeros(sets.shape, dtype=bool)
        np.put_along_axis(listed, order, np.arange(n_classes) < sizes[:, None], axis=1)
        np.testing.assert_array_equal(listed, sets)
        for k in range(n_classes):
            own = conformal.floor_scores(test, np.full(len(test), k), method, **params)
            np.testing.assert_array_equal(sets[:, k], own - q <= SCORE_ATOL)
    pv = p_values(test, scores, method, floor=True, **params)
    for alpha in (0.05, 0.1, 0.2, 0.5):
        np.testing.assert_array_equal(
            pv > alpha, prediction_sets(test, conformal_quantile(scores, alpha), method, floor=True, **params)
        )


def test_a_floor_calibrator_round_trips_and_refuses_draws():
    rng = np.random.default_rng(33)
    probs, labels = calibrated(rng, 100, 4)
    cal = SplitConformal.fit(probs, labels, "raps", k_reg=1, lam=0.1, floor=True)
    back = SplitConformal.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.floor and not back.randomized and np.array_equal(back.scores, cal.scores)
    assert "floor" not in SplitConformal.fit(probs, labels, "lac").to_dict()  # files before floor sets read alike
    np.testing.assert_array_equal(back.sets(probs, 0.1), cal.sets(probs, 0.1))
    with pytest.raises(ValueError, match="`u`"):
        cal.sets(probs, 0.1, u=np.zeros(len(probs)))
    with pytest.raises(ValueError, match="`u`"):
        SplitConformal.fit(probs, labels, "aps", u=rng, floor=True)
    with pytest.raises(ValueError, match="`floor`"):
        prediction_sets(probs, 0.5, "aps", floor="yes")
