"""calibkit.stats.BinStats: merged statistics equal one-shot metrics; JSON round trip."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibkit import binning, metrics
from calibkit.stats import BinStats
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax


def _batch(n, k, seed, scale=1.0):
    z, y = calibrated_logits(n, n_classes=k, seed=seed)
    return softmax(scale * z), y


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=6), st.integers(2, 6), st.integers(5, 20), st.integers(0, 10_000)
)
def test_merging_batches_equals_one_shot_metrics(sizes, k, n_bins, seed):
    batches = [_batch(n, k, seed + i, scale=1.7) for i, n in enumerate(sizes)]
    merged = BinStats.empty(k, n_bins)
    for probs, labels in batches:
        merged = merged.merge(BinStats.from_arrays(probs, labels, n_bins))
    probs = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert merged.n == len(labels)
    assert merged.ece() == pytest.approx(metrics.ece(probs, labels, n_bins), abs=1e-9)
    assert merged.mce() == pytest.approx(metrics.mce(probs, labels, n_bins), abs=1e-9)
    assert merged.classwise_ece() == pytest.approx(metrics.classwise_ece(probs, labels, n_bins), abs=1e-9)
    assert merged.debiased_ece() == pytest.approx(metrics.debiased_ece(probs, labels, n_bins), abs=1e-9)
    assert merged.overconfidence_error() == pytest.approx(metrics.overconfidence_error(probs, labels, n_bins), abs=1e-9)
    assert merged.accuracy() == pytest.approx(metrics.accuracy(probs, labels), abs=1e-9)
    assert merged.nll() == pytest.approx(metrics.nll(probs, labels), abs=1e-9)
    assert merged.brier() == pytest.approx(metrics.brier(probs, labels), abs=1e-9)
    assert merged.mean_confidence() == pytest.approx(probs.max(axis=1).mean(), abs=1e-9)
    one_shot = metrics.reliability_bins(probs, labels, n_bins)
    for got, want in zip(merged.reliability(), one_shot):
        np.testing.assert_allclose(got, want, atol=1e-9)


def test_update_in_place_equals_merge_and_plus():
    a, b = _batch(100, 3, 1), _batch(50, 3, 2)
    updated = BinStats.empty(3).update(*a).update(*b)
    summed = BinStats.from_arrays(*a) + BinStats.from_arrays(*b)
    assert updated.ece() == pytest.approx(summed.ece(), abs=1e-15)
    assert updated.nll() == pytest.approx(summed.nll(), abs=1e-15)
    np.testing.assert_allclose(updated.class_count, summed.class_count)


def test_json_round_trip_is_exact():
    stats = BinStats.from_arrays(*_batch(500, 4, 7))
    restored = BinStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert restored.to_dict() == stats.to_dict()
    assert restored.ece() == stats.ece()


def test_binary_vector_input():
    rng = np.random.default_rng(0)
    p, y = rng.random(300), rng.integers(0, 2, 300)
    stats = BinStats.from_arrays(p, y)
    assert stats.n_classes == 2
    assert stats.ece() == pytest.approx(metrics.ece(p, y), abs=1e-12)
    assert stats.brier() == pytest.approx(metrics.brier(p, y), abs=1e-12)


def test_empty_statistics_refuse_to_report():
    stats = BinStats.empty(3)
    assert stats.n == 0
    for method in (stats.ece, stats.accuracy, stats.nll, stats.classwise_ece):
        with pytest.raises(ValueError, match="no "):
            method()


def test_mismatched_statistics_do_not_merge():
    with pytest.raises(ValueError, match="cannot merge statistics of 3 classes x 15 bins with 3 classes x 10 bins"):
        BinStats.empty(3).merge(BinStats.empty(3, n_bins=10))
    with pytest.raises(ValueError, match="probs has 2 classes but these statistics are for 3"):
        BinStats.empty(3).update(np.array([[0.5, 0.5]]), np.array([0]))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"count": [1.0, 2.0]}, r"Expected `count` to have shape \(15,\)"),
        ({"correct_sum": [-1.0] * 15}, "finite non-negative"),
        ({"n_classes": 1}, "Expected `n_classes` to be an integer >= 2"),
        ({"n_bins": 0}, "Expected `n_bins` to be a positive integer"),
    ],
)
def test_from_dict_rejects_malformed_data(change, message):
    data = BinStats.from_arrays(*_batch(20, 3, 0)).to_dict()
    data.update(change)
    with pytest.raises(ValueError, match=message):
        BinStats.from_dict(data)


def test_from_dict_names_missing_fields():
    with pytest.raises(ValueError, match="missing fields: .*nll_sum"):
        BinStats.from_dict({"n_classes": 3, "n_bins": 15})


def test_statistics_without_classes_filled_from_bin_sums_equal_those_of_the_data():
    """What the service's store does: per-bin sums computed elsewhere (here by ``bin_sums``), added bin by
    bin and merged, give the metrics of the data itself; class-wise ECE is refused, not made up."""
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(4) * 0.5, size=300)
    labels = rng.integers(0, 4, size=300)
    full = BinStats.from_arrays(probs, labels, n_bins=15)
    halves = []
    for part in (slice(0, 120), slice(120, 300)):
        p, y = probs[part], labels[part]
        confidence, predicted = p.max(axis=1), p.argmax(axis=1)
        sums = binning.bin_sums(confidence, (predicted == y).astype(float), binning.equal_width_edges(15))
        filled = np.flatnonzero(sums.count)
        halves.append(
            BinStats.empty(None, 15).add_bins(
                filled,
                sums.count[filled],
                sums.confidence_sum[filled],
                sums.outcome_sum[filled],
                metrics.nll(p, y) * len(y),
                metrics.brier(p, y) * len(y),
            )
        )
    merged = halves[0] + halves[1]
    assert merged.n == 300 and merged.n_classes is None
    for name in ("ece", "mce", "debiased_ece", "accuracy", "mean_confidence", "nll", "brier"):
        assert getattr(merged, name)() == pytest.approx(getattr(full, name)(), rel=1e-12), name
    with pytest.raises(ValueError, match="without classes"):
        merged.classwise_ece()
    assert BinStats.from_dict(merged.to_dict()).to_dict() == merged.to_dict()
    with pytest.raises(ValueError, match=r"Expected `bins` to be bin indexes in \[0, 15\)"):
        BinStats.empty(None, 15).add_bins([15], [1], [0.5], [1])
    with pytest.raises(ValueError, match="finite non-negative"):
        BinStats.empty(None, 15).add_bins([0], [-1], [0.5], [1])
