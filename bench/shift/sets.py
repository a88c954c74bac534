"""The shift benchmark's prediction sets under label shift: split conformal sets at 1 - ``SET_ALPHA``, unadapted and
weighted by the prior ratios (``calibkit.conformal.label_shift_quantiles``, Podkopaev & Ramdas 2021); the page
(``render``) says what each set and figure is.

A split's coverage under pi_t is sum_y pi_t(y) cov_y over the pool, cov_y the share of the pool's rows of class y
whose label is in their set: given the split, with the noise of the pool's finite rows (about sqrt(0.09 / rows of the
class)). The synthetic sources' splits are fresh rows (``SPARE_ROWS``), so their mean is over the calibration draw,
which split conformal's guarantee is about; set sizes are on a subsample of the pool (``POOL_LIMIT``).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from bench.shift.streams import ALPHAS, Source
from calibkit.conformal import SCORE_ATOL, classwise_quantiles, conformity_scores, label_shift_quantiles
from calibkit.label_shift import em_priors

SET_ALPHA = 0.1
#: Target priors per Dirichlet concentration, each with ``streams`` calibration splits.
SET_SHIFTS = 10
#: The share of the reference rows that calibrates each split.
CALIBRATION_SHARE = 0.5
#: Unlabelled rows of the target that EM estimates the priors on.
SET_WINDOW = 2_000
#: The rows of a synthetic source's pool set apart for fresh calibration draws; the coverage is computed on the rest.
SPARE_ROWS = 20_000
#: The most pool rows that the set sizes are computed on (a seeded subsample beyond).
POOL_LIMIT = 20_000
RULES = ("lac", "aps")
VARIANTS = ("unadapted", "em", "oracle", "classwise")


def _scores(probs: np.ndarray, labels: np.ndarray, rule: str, u: np.ndarray | None) -> np.ndarray:
    """``rule``'s conformity scores, the randomized ones (APS) with the uniform draws ``u``."""
    return conformity_scores(probs, labels, rule, u=u if rule != "lac" else None)


def all_scores(probs: np.ndarray, rule: str, u: np.ndarray | None) -> np.ndarray:
    """s(x_i, k) for every row and label (N, K): the set at thresholds q (one per label) is s <= q + SCORE_ATOL."""
    return np.stack([_scores(probs, np.full(len(probs), c), rule, u) for c in range(probs.shape[1])], axis=1)


def set_rows(source: Source, streams: int, seed: int) -> list[dict]:
    """One row per alpha and rule: each variant's coverage and set size per shift, and across shifts."""
    pool = source.pools["clean"]
    rng = np.random.default_rng(seed)
    m = len(source.reference_labels)
    size_calibration = int(CALIBRATION_SHARE * m)
    evaluated = np.arange(len(pool.labels))
    if len(evaluated) >= 5 * SPARE_ROWS:  # a synthetic source: calibrate on fresh rows of the pool
        order = rng.permutation(len(evaluated))
        evaluated, spare = np.sort(order[SPARE_ROWS:]), order[:SPARE_ROWS]
        calibration_probs, calibration_labels = pool.probs[spare], pool.labels[spare]
    else:  # digits: random halves of the validation rows
        calibration_probs, calibration_labels = source.reference_probs, source.reference_labels
    probs, labels = pool.probs[evaluated], pool.labels[evaluated]
    k = probs.shape[1]
    pi_s = np.asarray(source.reference.mean_probabilities)
    pi_s = pi_s / pi_s.sum()
    u_pool, u_calibration = rng.random(len(labels)), rng.random(len(calibration_labels))
    # coverage: every evaluated row's own-label score, sorted within its class; sizes: a subsample's every score
    sized = np.sort(rng.choice(len(labels), min(POOL_LIMIT, len(labels)), replace=False))
    scores = {rule: all_scores(probs[sized], rule, u_pool[sized]) for rule in RULES}
    by_class = [np.flatnonzero(labels == c) for c in range(k)]
    own = {rule: [np.sort(_scores(probs[i], labels[i], rule, u_pool[i])) for i in by_class] for rule in RULES}
    reference = {rule: _scores(calibration_probs, calibration_labels, rule, u_calibration) for rule in RULES}
    class_rows = np.array([len(i) for i in by_class], dtype=np.float64)
    sized_labels = labels[sized]
    sized_rows = np.bincount(sized_labels, minlength=k).astype(np.float64)
    rows = []
    for alpha in ALPHAS:
        shifts = rng.dirichlet(np.full(k, alpha), SET_SHIFTS)
        # per shift, split, rule, variant: (coverage, size)
        cover = np.zeros((SET_SHIFTS, streams, len(RULES), len(VARIANTS)))
        size = np.zeros_like(cover)
        em_l1 = np.zeros((SET_SHIFTS, streams))
        for s, target in enumerate(shifts):
            oracle = target / source.true_priors
            for split in range(streams):
                calibration = rng.choice(len(calibration_labels), size_calibration, replace=False)
                counts = rng.multinomial(SET_WINDOW, target)
                window = np.concatenate([rng.choice(pool.by_class[c], counts[c]) for c in range(k) if counts[c]])
                em = em_priors(pool.probs[window], pi_s)
                em_l1[s, split] = float(np.abs(np.asarray(em.priors) - target).sum())
                y = calibration_labels[calibration]
                for r, rule in enumerate(RULES):
                    cal = reference[rule][calibration]
                    weighted = [
                        label_shift_quantiles(cal, y, w, SET_ALPHA, k) for w in (np.ones(k), em.weights, oracle)
                    ]
                    thresholds = (*weighted, classwise_quantiles(cal, y, SET_ALPHA, k))  # as ``VARIANTS``
                    for v, q in enumerate(thresholds):
                        held = np.array(
                            [np.searchsorted(own[rule][c], q[c] + SCORE_ATOL, side="right") for c in range(k)]
                        )
                        sizes = np.bincount(
                            sized_labels, weights=(scores[rule] <= q + SCORE_ATOL).sum(axis=1), minlength=k
                        )
                        with np.errstate(invalid="ignore", divide="ignore"):
                            per_class_cover = np.where(class_rows > 0, held / class_rows, 1.0)
                            per_class_size = np.where(sized_rows > 0, sizes / sized_rows, 0.0)
                        cover[s, split, r, v] = target @ per_class_cover
                        size[s, split, r, v] = target @ per_class_size
        tv = 0.5 * np.abs(shifts - source.true_priors).sum(axis=1)
        for r, rule in enumerate(RULES):
            row: dict = {
                "source": source.name,
                "alpha": alpha,
                "rule": rule,
                "shifts": SET_SHIFTS,
                "splits": streams,
                "calibration_rows": size_calibration,
                "fresh_calibration": bool(len(calibration_labels) != m),
                "target": 1 - SET_ALPHA,
                "shift_tv": [float(t) for t in tv],
                "em_l1": float(em_l1.mean()),
            }
            for v, variant in enumerate(VARIANTS):
                c = cover[:, :, r, v]
                means = c.mean(axis=1)
                half = stats.t.ppf(0.975, streams - 1) * c.std(axis=1, ddof=1) / np.sqrt(streams)
                worst = int(np.argmin(means))
                row |= {
                    f"cover_{variant}": [float(x) for x in means],
                    f"cover_{variant}_ci": [[float(a - h), float(a + h)] for a, h in zip(means, half)],
                    f"worst_{variant}": float(means[worst]),
                    f"worst_{variant}_ci": [float(means[worst] - half[worst]), float(means[worst] + half[worst])],
                    f"mean_{variant}": float(means.mean()),
                    f"missed_{variant}": int(np.sum(means + half < 1 - SET_ALPHA - 0.01)),
                    f"size_{variant}": float(size[:, :, r, v].mean()),
                }
            rows.append(row)
            print(
                f"sets {source.name} alpha {alpha:g} {rule}: worst "
                + ", ".join(f"{v} {row[f'worst_{v}']:.4f}" for v in VARIANTS),
                flush=True,
            )
    return rows
