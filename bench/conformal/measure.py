"""The conformal benchmark's measurements: split conformal on many seeded splits of the committed digits model and of
calibrated synthetic traffic, and the cost of sets and p-values per batch. Everything comes from
``calibkit.conformal``, so the benchmark measures what serving will call."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from bench.common import CIFAR_LIKE, digits_model, progress, table
from calibkit.conformal import (
    SplitConformal,
    classwise_quantiles,
    conformal_quantile,
    conformity_scores,
    pick_k_reg,
    prediction_sets,
    quantile_rank,
)
from calibkit.temperature import softmax
from service.serving.conformal import ModelSets, SetChoice, row_draws
from service.store.rows import prediction_ids

ALPHAS = (0.05, 0.1, 0.2)
#: (method, randomized): the scores compared. LAC has no randomized version.
VARIANTS = (("lac", False), ("aps", True), ("raps", True), ("aps", False), ("raps", False))
#: RAPS's penalty per rank beyond k_reg: the small value of Angelopoulos et al.'s adaptiveness runs, which trims
#: the noisy tail of a set without turning RAPS into a fixed top-k (a large lambda does, and loses adaptiveness).
LAMBDA = 0.01
#: Coverage by set size is read in bins of at least this many test labels; sizes 0 and 1 share the first bin, as
#: in the RAPS paper's table (an empty randomized set covers nothing by definition).
MIN_BIN_LABELS = 100
SYNTHETIC_CAL, SYNTHETIC_TEST, SYNTHETIC_TUNING = 1_000, 1_000, 2_000
#: The cost batches: rows per batch, and the threshold's miscoverage.
COST_ROWS, COST_ALPHA, COST_CALIBRATION = 64, 0.1, 2_000
#: The 1,000-class mix: logits N(0, 1), plus for these shares of rows a boost of U(8, 14) on one class (peaked),
#: of U(5, 8) on each of 5 classes (ambiguous between a few, as breeds of dogs), or nothing (flat, as an input
#: unlike any class). The flat rows' APS sets hold most classes.
MIX = (0.80, 0.15, 0.05)
EXCHANGEABLE_COLUMNS = "data alpha method k_reg coverage coverage_se exact_mean excess ks_d ks_p size".split()
BIN_COLUMNS = ["data", "alpha", "method", "sizes", "labels", "examples", "coverage"]
CLASS_COLUMNS = ["data", "alpha", "method", "sets", "worst_class", "worst_coverage", "best_coverage", "size"]
COST_COLUMNS = ["classes", "rows", "op", "method", "randomized", "median_ms", "p90_ms", "repeats"]


def method_name(method: str, randomized: bool) -> str:
    return method.upper() + ("" if method == "lac" else " randomized" if randomized else " non-randomized")


# --- the reference law and the bins -------------------------------------------------------------------------


def exact_law(n: int, m: int, alpha: float) -> stats.rv_discrete:
    """The law of the number of m test labels that split conformal covers with n calibration scores free of ties.

    Given the calibration set, coverage is Beta(n + 1 - l, l), l = n + 1 - ceil((n + 1)(1 - alpha)) (Vovk 2012);
    each of m exchangeable test labels is covered with that probability, so the count is BetaBinomial(m, n + 1 - l,
    l). This holds for i.i.d. draws and for random splits of one fixed pool of distinct scores alike (the count
    depends only on the ranks, uniform in both cases).
    """
    k = quantile_rank(n, alpha)
    if k > n:
        raise ValueError(f"alpha: {alpha} needs more than n={n} calibration scores for a finite threshold")
    return stats.betabinom(m, k, n + 1 - k)


def exact_mean(n: int, alpha: float) -> float:
    """E[coverage] = 1 - l / (n + 1) of sets from n calibration scores free of ties."""
    return quantile_rank(n, alpha) / (n + 1)


def law_test(covered: np.ndarray, n: int, m: int, alpha: float, rng: np.random.Generator) -> tuple[float, float]:
    """(KS statistic, p-value) of per-split covered counts against ``exact_law``.

    The counts are discrete, so each goes through the randomized probability integral transform
    U = F(c - 1) + V f(c), V ~ Uniform(0, 1), which is exactly Uniform(0, 1) under the law; then a KS test of the
    U against the uniform.
    """
    law = exact_law(n, m, alpha)
    c = np.asarray(covered)
    u = law.cdf(c - 1) + rng.uniform(size=c.shape) * law.pmf(c)
    result = stats.kstest(u, "uniform")
    return float(result.statistic), float(result.pvalue)


def size_bins(labels: np.ndarray, covered: np.ndarray, min_labels: int = MIN_BIN_LABELS) -> list[dict]:
    """Coverage by set size in bins of at least ``min_labels`` of the ``labels[s]`` (and ``covered[s]``) at size s:
    sizes 0 and 1 start the first bin, a last bin that falls short joins the one before."""
    labels, covered = np.asarray(labels), np.asarray(covered)
    present = np.flatnonzero(labels)
    bins: list[list[int]] = []
    for s in present:
        if bins and (s <= 1 and bins[-1][0] <= 1 or sum(labels[bins[-1]]) < min_labels):
            bins[-1].append(int(s))
        else:
            bins.append([int(s)])
    if len(bins) > 1 and sum(labels[bins[-1]]) < min_labels:
        last = bins.pop()
        bins[-1] += last
    out = []
    for sizes in bins:
        n, c, low, high = int(labels[sizes].sum()), int(covered[sizes].sum()), sizes[0], sizes[-1]
        shown = str(low) if low == high else f"{low}-{high}"
        out.append({"sizes": shown, "low": low, "high": high, "labels": n, "covered": c, "coverage": c / n})
    return out


# --- the data ------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """Labelled probabilities to split: ``split(rng)``; test ids name a finite pool's rows, None for fresh draws."""

    name: str
    n_classes: int
    n_cal: int
    n_test: int
    tuning: tuple[np.ndarray, np.ndarray]
    split: Callable[[np.random.Generator], tuple]
    pool: int | None
    about: dict = field(default_factory=dict)


def digits_source() -> Source:
    """The committed model's calibrated probabilities on the digits test split (359 images it never saw), split at
    random into halves; ``k_reg`` is tuned on the validation split, which the splits never use."""
    from training.data import load_digits_splits

    probs = digits_model()
    splits = load_digits_splits()

    pool_p, pool_y = probs(splits.test.x), splits.test.y
    n_cal = len(pool_y) // 2

    def split(rng: np.random.Generator) -> tuple:
        order = rng.permutation(len(pool_y))
        cal, test = order[:n_cal], order[n_cal:]
        return pool_p[cal], pool_y[cal], pool_p[test], pool_y[test], test

    true_p = pool_p[np.arange(len(pool_y)), pool_y]
    return Source(
        name="digits",
        n_classes=pool_p.shape[1],
        n_cal=n_cal,
        n_test=len(pool_y) - n_cal,
        tuning=(probs(splits.val.x), splits.val.y),
        split=split,
        pool=len(pool_y),
        about={
            "pool": len(pool_y),
            "accuracy": float((pool_p.argmax(axis=1) == pool_y).mean()),
            "mean_confidence": float(pool_p.max(axis=1).mean()),
            "tied_label_probabilities": int(len(true_p) - len(np.unique(true_p))),
            "tuning": len(splits.val.y),
        },
    )


def synthetic_source(seed: int) -> Source:
    """Calibrated CIFAR-like traffic (``CIFAR_LIKE``), labels drawn from softmax of the logits; the traffic is
    unlimited, so each split draws its own sets, and ``k_reg`` is tuned on a separate sample."""

    def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        z, y = CIFAR_LIKE.logits(rng, (n,))
        return softmax(z), y

    def split(rng: np.random.Generator) -> tuple:
        p, y = draw(rng, SYNTHETIC_CAL + SYNTHETIC_TEST)
        return p[:SYNTHETIC_CAL], y[:SYNTHETIC_CAL], p[SYNTHETIC_CAL:], y[SYNTHETIC_CAL:], None

    tuning = draw(np.random.default_rng(seed), SYNTHETIC_TUNING)
    sample_p, sample_y = draw(np.random.default_rng(seed + 1), 100_000)
    return Source(
        name="cifar-like",
        n_classes=CIFAR_LIKE.n_classes,
        n_cal=SYNTHETIC_CAL,
        n_test=SYNTHETIC_TEST,
        tuning=tuning,
        split=split,
        pool=None,
        about={
            "logit_scale": CIFAR_LIKE.logit_scale,
            "accuracy": float((sample_p.argmax(axis=1) == sample_y).mean()),
            "mean_confidence": float(sample_p.max(axis=1).mean()),
            "tuning": SYNTHETIC_TUNING,
        },
    )


# --- the splits ----------------------------------------------------------------------------------------------


class Tally:
    """What one (alpha, method, sets) accumulates over the splits: coverage and sizes per split, by set size and by
    class, and for a pool the distinct test examples by set size."""

    def __init__(self, splits: int, n_classes: int, pool: int | None) -> None:
        self.covered = np.zeros(splits, dtype=np.int64)
        self.size = np.zeros(splits)
        self.by_size = np.zeros((2, n_classes + 1), dtype=np.int64)
        self.by_class = np.zeros((2, n_classes), dtype=np.int64)
        self.examples = None if pool is None else np.zeros((pool, n_classes + 1), dtype=bool)

    def add(self, i: int, sets: np.ndarray, labels: np.ndarray, ids: np.ndarray | None) -> None:
        hit = sets[np.arange(len(labels)), labels]
        size = sets.sum(axis=1)
        k = sets.shape[1]
        self.covered[i] = hit.sum()
        self.size[i] = size.mean()
        self.by_size[0] += np.bincount(size, minlength=k + 1)
        self.by_size[1] += np.bincount(size[hit], minlength=k + 1)
        self.by_class[0] += np.bincount(labels, minlength=k)
        self.by_class[1] += np.bincount(labels[hit], minlength=k)
        if self.examples is not None and ids is not None:
            self.examples[ids, size] = True


def run_splits(source: Source, splits: int, seed: int) -> dict:
    """Every variant at every alpha, marginal and (LAC and the randomized scores) Mondrian, on ``splits`` splits."""
    k_regs = {alpha: pick_k_reg(*source.tuning, alpha) for alpha in ALPHAS}
    tallies: dict[tuple, Tally] = defaultdict(lambda: Tally(splits, source.n_classes, source.pool))
    rng = np.random.default_rng(seed)
    for i in range(splits):
        p_cal, y_cal, p_test, y_test, ids = source.split(rng)
        u_cal, u_test = rng.uniform(size=len(y_cal)), rng.uniform(size=len(y_test))
        for method, randomized in VARIANTS:
            scores_by_k: dict[int, np.ndarray] = {}
            for alpha in ALPHAS:
                k_reg, lam = (k_regs[alpha], LAMBDA) if method == "raps" else (0, 0.0)
                kw: dict[str, Any] = {"k_reg": k_reg, "lam": lam, "u": u_test if randomized else None}
                if k_reg not in scores_by_k:
                    scores_by_k[k_reg] = conformity_scores(
                        p_cal, y_cal, method, k_reg=k_reg, lam=lam, u=u_cal if randomized else None
                    )
                scores = scores_by_k[k_reg]
                sets = prediction_sets(p_test, conformal_quantile(scores, alpha), method, **kw)
                tallies[alpha, method, randomized, "marginal"].add(i, sets, y_test, ids)
                if randomized or method == "lac":
                    q = classwise_quantiles(scores, y_cal, alpha, source.n_classes)
                    mondrian = prediction_sets(p_test, q, method, **kw)
                    tallies[alpha, method, randomized, "mondrian"].add(i, mondrian, y_test, ids)
    return {"k_regs": k_regs, "tallies": tallies}


def source_rows(source: Source, splits: int, seed: int) -> dict:
    """The rows of one source: coverage and the law test, coverage by set size, by class."""
    measured = run_splits(source, splits, seed)
    n, m = source.n_cal, source.n_test
    law_rng = np.random.default_rng(seed + 7)
    exchangeable, bins, classes = [], [], []
    for (alpha, method, randomized, sets), t in measured["tallies"].items():
        name = method_name(method, randomized)
        coverage = t.covered / m
        by_class = t.by_class[1] / np.maximum(t.by_class[0], 1)
        worst = int(np.argmin(by_class))
        classes.append(
            {
                "data": source.name,
                "alpha": alpha,
                "method": name,
                "sets": sets,
                "worst_class": worst,
                "worst_coverage": float(by_class[worst]),
                "best_coverage": float(by_class.max()),
                "size": float(t.size.mean()),
            }
        )
        if sets != "marginal":
            continue
        # LAC's scores are continuous too (the law is exact but for ties); the non-randomized APS and RAPS sets
        # always hold the top label, so they are conservative and only their excess is reported
        tested = randomized or method == "lac"
        ks_d, ks_p = law_test(t.covered, n, m, alpha, law_rng) if tested else (None, None)
        exchangeable.append(
            {
                "data": source.name,
                "alpha": alpha,
                "method": name,
                "randomized": randomized,
                "k_reg": measured["k_regs"][alpha] if method == "raps" else None,
                "splits": splits,
                "coverage": float(coverage.mean()),
                "coverage_se": float(coverage.std(ddof=1) / np.sqrt(splits)),
                "exact_mean": exact_mean(n, alpha),
                "excess": float(coverage.mean() - (1 - alpha)),
                "ks_d": ks_d,
                "ks_p": ks_p,
                "size": float(t.size.mean()),
                "size_se": float(t.size.std(ddof=1) / np.sqrt(splits)),
            }
        )
        if randomized or method == "lac":
            for b in size_bins(*t.by_size):
                examples = (
                    b["labels"] if t.examples is None else int(t.examples[:, b["low"] : b["high"] + 1].any(1).sum())
                )
                bins.append({"data": source.name, "alpha": alpha, "method": name, **b, "examples": examples})
    for row in exchangeable:
        progress(row, EXCHANGEABLE_COLUMNS)
    return {"exchangeable": exchangeable, "bins": bins, "classes": classes}


# --- the cost ------------------------------------------------------------------------------------------------


def mixed_probs(rng: np.random.Generator, n: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of the cost mix (``MIX``) over ``n_classes`` and labels drawn from them."""
    z = rng.normal(0.0, 1.0, size=(n, n_classes))
    kind = rng.choice(3, size=n, p=MIX)
    peaked, ambiguous = np.flatnonzero(kind == 0), np.flatnonzero(kind == 1)
    z[peaked, rng.integers(0, n_classes, len(peaked))] += rng.uniform(8, 14, len(peaked))
    classes = rng.integers(0, n_classes, (len(ambiguous), 5))
    z[ambiguous[:, None], classes] += rng.uniform(5, 8, (len(ambiguous), 5))
    p = softmax(z)
    cumulative = np.cumsum(p, axis=1)
    labels = np.minimum((rng.random((n, 1)) > cumulative).sum(axis=1), n_classes - 1)
    return p, labels


def cost_draw(rng: np.random.Generator, n: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` labelled rows for the cost: ``mixed_probs`` at 1,000 classes, ``CIFAR_LIKE`` at 10."""
    if n_classes == CIFAR_LIKE.n_classes:
        z, y = CIFAR_LIKE.logits(rng, (n,))
        return softmax(z), y
    return mixed_probs(rng, n, n_classes)


def time_calls(call: Callable[[int], object], n_batches: int, repeats: int):
    """Wall time of ``repeats`` calls ``call(i)``, cycling i over the batches, after a warm-up."""
    for i in range(min(repeats, n_batches)):
        call(i)
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        call(i % n_batches)
        times[i] = time.perf_counter() - start
    return times


def cost_rows(repeats: int, seed: int) -> tuple[list[dict], dict]:
    """Median and 90th-percentile wall time per batch of 64 rows at 1,000 classes and at 10, cycling over 32 batches
    so that no batch stays cached: the service's sets (``ModelSets.sets``), listed (``ServedSets.listed``), as masks
    (``SplitConformal.sets``), and the p-values."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**62, (COST_ROWS, 1_000))
    # the machine's own floor for the ranking: numpy's sort of one batch of int64 keys (how fast it is depends on
    # whether numpy's SIMD sort runs on this CPU)
    rows = []
    about: dict[str, Any] = {"sort_ms": float(np.median(time_calls(lambda i: np.sort(keys, axis=1), 1, repeats)) * 1e3)}
    for n_classes in (1_000, 10):
        cal_p, cal_y = cost_draw(rng, COST_CALIBRATION, n_classes)
        tune_p, tune_y = cost_draw(rng, COST_CALIBRATION, n_classes)
        batches = [cost_draw(rng, COST_ROWS, n_classes)[0] for _ in range(32)]
        outputs = [b.astype(np.float32) for b in batches]  # what the service's graphs return
        ids = [prediction_ids(COST_ROWS) for _ in range(32)]
        uniform = [row_draws(i) for i in ids]
        top = tune_p.max(axis=1)
        rank = np.count_nonzero(tune_p >= tune_p[np.arange(len(tune_y)), tune_y][:, None], axis=1)
        k_reg = pick_k_reg(tune_p, tune_y, COST_ALPHA)
        about[str(n_classes)] = {
            "top_p50": float(np.median(top)),
            "top_below_0.5": float((top < 0.5).mean()),
            "top1": float((rank == 1).mean()),
            "top5": float((rank <= 5).mean()),
            "k_reg": k_reg,
        }
        for method, randomized in VARIANTS:
            kw: dict[str, Any] = {"k_reg": k_reg, "lam": LAMBDA} if method == "raps" else {}
            cal = SplitConformal.fit(cal_p, cal_y, method, u=rng if randomized else None, **kw)
            draws = uniform if randomized else [None] * len(batches)
            sizes = np.concatenate([cal.sets(b, COST_ALPHA, u=u).sum(axis=1) for b, u in zip(batches, draws)])
            # served: the randomized rows' exact sets, the non-randomized rows' floor sets (the service's default)
            served = ModelSets({method: cal}, method, 1 - COST_ALPHA)
            choice = SetChoice(method, 1 - COST_ALPHA, randomized=randomized)
            calls: dict[str, Callable[..., object]] = {
                "served": lambda i, s=served, c=choice, b=outputs, n=ids: s.sets(b[i], n[i], c),
                "listed": lambda i, s=served, c=choice, b=outputs, n=ids: s.sets(b[i], n[i], c).listed(),
                "sets": lambda i, cal=cal, b=batches, d=draws: cal.sets(b[i], COST_ALPHA, u=d[i]),
                "p_values": lambda i, cal=cal, b=batches, d=draws: cal.p_values(b[i], u=d[i]),
            }
            for op, call in calls.items():
                times = time_calls(call, len(batches), repeats)
                row = {
                    "classes": n_classes,
                    "rows": COST_ROWS,
                    "op": op,
                    "method": method_name(method, randomized),
                    "randomized": randomized,
                    "median_ms": float(np.median(times) * 1e3),
                    "p90_ms": float(np.quantile(times, 0.9) * 1e3),
                    "repeats": repeats,
                    "mean_set_size": float(sizes.mean()),
                }
                rows.append(progress(row, COST_COLUMNS))
    return rows, about


def run(args) -> dict:
    """Every measurement of ``python -m bench.conformal``: the splits, the cost per batch, ``shift``, ``serving``,
    ``e2e``."""
    sources = [digits_source(), synthetic_source(args.seed + 100)]
    out: dict = {"setup": vars(args) | {"alphas": list(ALPHAS), "lambda": LAMBDA, "min_bin_labels": MIN_BIN_LABELS}}
    out["sources"] = {
        s.name: {"n_cal": s.n_cal, "n_test": s.n_test, "fresh_draws": s.pool is None, **s.about} for s in sources
    }
    print(table([], EXCHANGEABLE_COLUMNS), flush=True)
    for key in ("exchangeable", "bins", "classes"):
        out[key] = []
    for i, source in enumerate(sources):
        rows = source_rows(source, args.splits, args.seed + i)
        for key, value in rows.items():
            out[key] += value
    print(table([], COST_COLUMNS), flush=True)
    out["cost"], out["cost_mix"] = cost_rows(args.repeats, args.seed + 200)
    from bench.conformal import serving, shift

    out["shift"] = shift.run(args)
    print(table([], serving.ROUND_COLUMNS), flush=True)
    out["serving"] = (
        serving.run(1.0, 1, cost_repeats=20) if args.smoke else serving.run(args.serving_seconds, args.serving_rounds)
    )
    if args.e2e_streams:
        from bench.conformal import e2e

        small: dict[str, Any] = {"delays": (100,), "measured": 300, "shift_min": 300, "alarm": 4} if args.smoke else {}
        out["e2e"] = e2e.run(args.seed + 500, args.e2e_streams, args.e2e_shift_streams, **small)
    return out
