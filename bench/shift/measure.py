"""The shift benchmark's measurements: for every source, shift and window size, ``streams`` seeded windows, and on each
the label-free estimates of ``calibkit`` against what the labels show.

On a window of n served probabilities p (rows x_i, labels y_i, target priors pi_t), with pi_s the reference's mean
calibrated probabilities (``LabelShiftReference.mean_probabilities``, the priors the posteriors assume):

- ``plain``: ``estimate_accuracy(p)``, the mean confidence and its Poisson-binomial interval (Kivimäki et al. 2024),
  against the realized accuracy of the served argmax;
- ``adapted``: EM's priors (``em_priors``, Saerens et al. 2002) give w = pi_em / pi_s and p' = ``adapt_probabilities``
  (p, w); ``estimate_accuracy(p')`` against the realized accuracy of argmax p', the predictions served with
  adaptation on; and mean_i p'(argmax p_i | x_i), the adapted estimate of the unadapted predictions' accuracy, the
  one to set beside NannyML's CBPE, which estimates the served predictions' accuracy;
- ``carried`` (label-shift rows): ``estimate_adapted_accuracy``'s interval, which mixes the Poisson-binomial laws
  over EM's bootstrap priors and so carries their error, beside the plain adapted interval, which treats p' as
  exact; ``carried_error``, on a few windows of n <= ``EXACT_WINDOW``, the most its normal approximation moves an
  end against the exact laws, in counts;
- priors: the L1 distance of EM's and BBSE's (``bbse_priors``, Lipton et al. 2018) priors from the window's realized
  class frequencies;
- the oracle: p adapted with the true w = pi_t / pi_true (``Source.true_priors``); its accuracy and NLL against the
  EM-adapted ones (Alexandari et al. 2020's comparison), and its estimate of the served predictions' accuracy, the
  error no label-free estimate avoids (the realized accuracy's own sampling noise); ``dev_*``: each estimate's mean
  distance from that expected accuracy instead of the realized one;
- CBPE (``bench/shift/cbpe.py``, in .venv-cbpe) on the same windows;
- the label-shift alarm's rows (``bench.shift.alarm``) and the sets under label shift (``bench.shift.sets``).

Coverage is the share of windows whose interval holds the realized accuracy, with its Clopper-Pearson interval.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench.common import ROOT
from bench.shift import alarm, sets
from bench.shift.streams import Scenario, Source, Windows, draw_windows, scenarios, sources
from calibkit import metrics
from calibkit.estimated_accuracy import estimate_accuracy, estimate_adapted_accuracy
from calibkit.label_shift import adapt_probabilities, bbse_priors, em_priors

WINDOWS = (500, 2_000)
LEVEL = 0.95
#: Bootstrap resamples of the reference rows for the upper bounds of its calibration error.
REFERENCE_RESAMPLES = 2_000
#: EM's bootstrap resamples in the interval that carries the priors' error (label-shift rows).
CARRY_RESAMPLES = 100
#: Windows of each label-shift row whose carried interval is also computed from the exact laws.
EXACT_CHECKS = 3
#: The largest window checked against the exact laws (they cost O(R n^2)).
EXACT_WINDOW = 500
CBPE_PYTHON = ROOT / ".venv-cbpe" / "bin" / "python"
CBPE_SCRIPT = Path(__file__).with_name("cbpe.py")


def clopper_pearson(hits: int, n: int, level: float = 0.95) -> list[float]:
    """The exact binomial interval of a share ``hits`` / ``n`` (Clopper & Pearson 1934)."""
    tail = (1 - level) / 2
    low = float(stats.beta.ppf(tail, hits, n - hits + 1)) if hits > 0 else 0.0
    high = float(stats.beta.ppf(1 - tail, hits + 1, n - hits)) if hits < n else 1.0
    return [low, high]


def reference_error(source: Source, seed: int, resamples: int = REFERENCE_RESAMPLES) -> dict:
    """The reference rows' calibration error with 95% bootstrap upper bounds: the top-label ECE (15 bins) and the
    mean-confidence gap |mean c - accuracy|, the bias of the plain estimate on the reference. ECE >= |gap|."""
    p, y = source.reference_probs, source.reference_labels
    confidence, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(y), (resamples, len(y)))
    eces = np.array([metrics.ece(p[d], y[d]) for d in draws])
    gaps = np.abs(confidence[draws].mean(axis=1) - correct[draws].mean(axis=1))
    return {
        "rows": len(y),
        "ece": metrics.ece(p, y),
        "ece_upper": float(np.quantile(eces, 0.95)),
        "gap": float(confidence.mean() - correct.mean()),
        "gap_upper": float(np.quantile(gaps, 0.95)),
    }


def window_measures(
    p: np.ndarray, y: np.ndarray, priors: np.ndarray, source: Source, pi_s, confusion, carry=False, exact=False
) -> dict:
    """Every per-window figure of the module's docstring, for one window; with ``carry`` the interval that carries
    EM's error too, and with ``exact`` how far its normal approximation moves its ends (in counts)."""
    n, k = p.shape
    rows = np.arange(n)
    served = p.argmax(axis=1)
    plain = estimate_accuracy(p, LEVEL)
    em = em_priors(p, pi_s)
    adapted = adapt_probabilities(p, em.weights)
    adapted_estimate = estimate_accuracy(adapted, LEVEL)
    oracle = adapt_probabilities(p, priors / source.true_priors)
    frequencies = np.bincount(y, minlength=k) / n
    extra = {}
    if carry:
        carried = estimate_adapted_accuracy(p, pi_s, LEVEL, resamples=CARRY_RESAMPLES, seed=0)
        extra = {"carried_lower": carried.lower, "carried_upper": carried.upper}
        if exact:
            check = estimate_adapted_accuracy(p, pi_s, LEVEL, resamples=CARRY_RESAMPLES, seed=0, exact=True)
            extra["carried_error"] = n * max(abs(check.lower - carried.lower), abs(check.upper - carried.upper))
    return extra | {
        "realized": float(np.mean(served == y)),
        "plain": plain.estimate,
        "plain_lower": plain.lower,
        "plain_upper": plain.upper,
        "realized_adapted": float(np.mean(adapted.argmax(axis=1) == y)),
        "adapted": adapted_estimate.estimate,
        "adapted_lower": adapted_estimate.lower,
        "adapted_upper": adapted_estimate.upper,
        "served_adapted": float(adapted[rows, served].mean()),
        "em_l1": float(np.abs(np.asarray(em.priors) - frequencies).sum()),
        "em_converged": em.converged,
        "bbse_l1": float(np.abs(np.asarray(bbse_priors(p, confusion, LEVEL).priors) - frequencies).sum()),
        "freq_l1": float(np.abs(frequencies - priors).sum()),
        "accuracy_oracle": float(np.mean(oracle.argmax(axis=1) == y)),
        "served_oracle": float(oracle[rows, served].mean()),
        "nll_plain": metrics.nll(p, y),
        "nll_adapted": metrics.nll(adapted, y),
        "nll_oracle": metrics.nll(oracle, y),
    }


def measure_row(
    source: Source, scenario: Scenario, n: int, streams: int, seed: int, error: dict
) -> tuple[dict, Windows]:
    """One row: ``streams`` windows of n, their measures summed up; the windows, for CBPE."""
    pool = source.pools[scenario.condition]
    reference = source.reference
    pi_s, confusion = np.asarray(reference.mean_probabilities), np.asarray(reference.confusion)
    windows = draw_windows(pool, scenario.alpha, streams, n, seed)
    carry = scenario.shift == "label"
    per = [
        window_measures(
            pool.probs[i],
            pool.labels[i],
            priors,
            source,
            pi_s,
            confusion,
            carry,
            carry and j < EXACT_CHECKS and n <= EXACT_WINDOW,
        )
        for j, (i, priors) in enumerate(zip(windows.index, windows.priors))
    ]
    keys = dict.fromkeys(key for w in per for key in w)  # ``carried_error`` is on the first windows only
    v = {key: np.array([w[key] for w in per if key in w]) for key in keys}
    realized, adapted = v["realized"], v["realized_adapted"]

    def covered(lower, upper, truth, widen=0.0) -> np.ndarray:
        return (lower - widen <= truth + 1e-12) & (truth <= upper + widen + 1e-12)

    cover_plain = covered(v["plain_lower"], v["plain_upper"], realized)
    cover_adapted = covered(v["adapted_lower"], v["adapted_upper"], adapted)
    carried = {}
    if carry:
        held = covered(v["carried_lower"], v["carried_upper"], adapted)
        carried = {
            "cover_carried": float(held.mean()),
            "cover_carried_ci": clopper_pearson(int(held.sum()), streams),
            "width_carried": float((v["carried_upper"] - v["carried_lower"]).mean()),
            "carried_error": float(v["carried_error"].max()) if "carried_error" in v else None,
        }
    row = carried | {
        "source": source.name,
        "shift": scenario.shift,
        "condition": scenario.condition,
        "alpha": "" if scenario.alpha is None else scenario.alpha,
        "n": n,
        "streams": streams,
        "accuracy": float(realized.mean()),
        "accuracy_adapted": float(adapted.mean()),
        "accuracy_oracle": float(v["accuracy_oracle"].mean()),
        "accuracy_gap": float((v["accuracy_oracle"] - adapted).mean()),
        "bias_plain": float((v["plain"] - realized).mean()),
        "bias_adapted": float((v["adapted"] - adapted).mean()),
        "width_adapted": float((v["adapted_upper"] - v["adapted_lower"]).mean()),
        "mae_plain": float(np.abs(v["plain"] - realized).mean()),
        "mae_adapted": float(np.abs(v["adapted"] - adapted).mean()),
        "mae_served_adapted": float(np.abs(v["served_adapted"] - realized).mean()),
        "mae_oracle": float(np.abs(v["served_oracle"] - realized).mean()),
        "dev_plain": float(np.abs(v["plain"] - v["served_oracle"]).mean()),
        "dev_served_adapted": float(np.abs(v["served_adapted"] - v["served_oracle"]).mean()),
        "cover_plain": float(cover_plain.mean()),
        "cover_plain_ci": clopper_pearson(int(cover_plain.sum()), streams),
        "cover_adapted": float(cover_adapted.mean()),
        "cover_adapted_ci": clopper_pearson(int(cover_adapted.sum()), streams),
        "width_plain": float((v["plain_upper"] - v["plain_lower"]).mean()),
        "cover_widened_ece": float(covered(v["plain_lower"], v["plain_upper"], realized, error["ece_upper"]).mean()),
        "cover_widened_gap": float(covered(v["plain_lower"], v["plain_upper"], realized, error["gap_upper"]).mean()),
        "cover_adapted_widened_ece": float(
            covered(v["adapted_lower"], v["adapted_upper"], adapted, error["ece_upper"]).mean()
        ),
        "em_l1": float(v["em_l1"].mean()),
        "em_unconverged": int((~v["em_converged"].astype(bool)).sum()),
        "bbse_l1": float(v["bbse_l1"].mean()),
        "freq_l1": float(v["freq_l1"].mean()),
        "nll_plain": float(v["nll_plain"].mean()),
        "nll_adapted": float(v["nll_adapted"].mean()),
        "nll_oracle": float(v["nll_oracle"].mean()),
        "nll_ratio": float(v["nll_adapted"].mean() / v["nll_oracle"].mean() - 1.0),
        "nll_recovered": None
        if scenario.alpha is None  # no gain to recover
        else _share(v["nll_plain"].mean() - v["nll_adapted"].mean(), v["nll_plain"].mean() - v["nll_oracle"].mean()),
        "_realized": realized,
        "_expected": v["served_oracle"],
    }
    return row, windows


def _share(part: float, whole: float) -> float | None:
    return float(part / whole) if whole > 0 else None


def cbpe_estimates(
    all_sources: list[Source], cases: list[tuple[int, str, np.ndarray]]
) -> tuple[list[np.ndarray] | None, str]:
    """CBPE's estimated accuracy of each case's windows (case: the source's position, the pool, the rows (windows,
    n)), run by ``cbpe.py`` in .venv-cbpe; (None, why) when that venv or nannyml is missing or fails."""
    if not CBPE_PYTHON.exists():
        return None, f"not run: no {CBPE_PYTHON.relative_to(ROOT)} (make cbpe)"
    pools: dict[tuple[int, str], int] = {}
    arrays: dict[str, Any] = {}  # np.savez types its keywords as its own flags
    for s, source in enumerate(all_sources):
        arrays[f"reference_probs_{s}"] = source.reference_probs
        arrays[f"reference_labels_{s}"] = source.reference_labels
    for c, (s, condition, index) in enumerate(cases):
        if (s, condition) not in pools:
            pools[(s, condition)] = len(pools)
            arrays[f"pool_probs_{pools[(s, condition)]}"] = all_sources[s].pools[condition].probs
        arrays[f"case_{c}"] = index
        arrays[f"meta_{c}"] = np.array([s, pools[(s, condition)]])
    with tempfile.TemporaryDirectory() as tmp:
        inputs, output = Path(tmp) / "cases.npz", Path(tmp) / "cbpe.json"
        np.savez(inputs, **arrays)
        done = subprocess.run(
            [str(CBPE_PYTHON), str(CBPE_SCRIPT), str(inputs), str(output)], capture_output=True, text=True
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"failed in {CBPE_PYTHON.relative_to(ROOT)}: {last}"
        out = json.loads(output.read_text())
    return [np.asarray(e) for e in out["estimates"]], f"nannyml {out['nannyml']}"


def run(args) -> dict:
    """Every source x scenario x window size, then CBPE on the same windows."""
    all_sources = sources(args.seed, args.pool_rows)
    rows, cases, errors = [], [], {}
    seed = args.seed
    for s, source in enumerate(all_sources):
        errors[source.name] = reference_error(source, args.seed)
        for scenario in scenarios(source):
            for n in args.windows:
                seed += 1
                row, windows = measure_row(source, scenario, n, args.streams, seed, errors[source.name])
                rows.append(row)
                cases.append((s, scenario.condition, windows.index))
                print(
                    f"{source.name} {scenario.shift} {scenario.condition} {row['alpha']} n={n}: "
                    f"mae {row['mae_plain']:.4f} / adapted {row['mae_adapted']:.4f}, "
                    f"cover {row['cover_plain']:.3f}",
                    flush=True,
                )
    length = getattr(args, "alarm_length", alarm.ALARM_LENGTH)
    alarm_rows, set_rows = [], []
    for s, source in enumerate(all_sources):
        alarm_rows += alarm.alarm_rows(source, args.streams, length, args.seed + 1_000 * (s + 1), clopper_pearson)
        set_rows += sets.set_rows(source, args.streams, args.seed + 1_000 * (s + 1) + 500)
    from bench.shift import serving  # wrk and a service process: only when the benchmark runs

    cost = {}
    if getattr(args, "serving_rounds", 0):  # none in the unit tests' tiny runs
        smoke = getattr(args, "smoke", False)
        seconds, rounds, repeats = (1.0, 1, 20) if smoke else (args.serving_seconds, args.serving_rounds, 1000)
        modes = serving.MODES[-1:] if smoke else serving.MODES  # a smoke run: the mode whose path adapts
        cost = {mode: serving.run(seconds, rounds, cost_repeats=repeats, adapt=mode) for mode in modes}
    estimates, cbpe_note = cbpe_estimates(all_sources, cases)
    for i, row in enumerate(rows):
        realized, expected = row.pop("_realized"), row.pop("_expected")
        if estimates is not None:
            row["mae_cbpe"] = float(np.abs(estimates[i] - realized).mean())
            row["dev_cbpe"] = float(np.abs(estimates[i] - expected).mean())
            row["dev_cbpe_ratio"] = _share(row["dev_served_adapted"], row["dev_cbpe"])
            row["cbpe_ratio"] = _share(row["mae_served_adapted"], row["mae_cbpe"])
            row["plain_cbpe_ratio"] = _share(row["mae_plain"], row["mae_cbpe"])
    return {
        "setup": {
            "streams": args.streams,
            "windows": list(args.windows),
            "level": LEVEL,
            "seed": args.seed,
            "pool_rows": args.pool_rows,
            "alarm_length": length,
            "alarm_thresholds": list(alarm.THRESHOLDS),
            "set_alpha": sets.SET_ALPHA,
            "set_shifts": sets.SET_SHIFTS,
            "set_window": sets.SET_WINDOW,
            "carry_resamples": CARRY_RESAMPLES,
            "sources": {
                src.name: {
                    "classes": src.reference_probs.shape[1],
                    "reference_rows": len(src.reference_labels),
                    "true_priors": src.true_priors.tolist(),
                    "pools": {name: len(pool.labels) for name, pool in src.pools.items()},
                }
                for src in all_sources
            },
        },
        "reference_error": errors,
        "cbpe": cbpe_note,
        "rows": rows,
        "alarm": alarm_rows,
        "sets": set_rows,
        "serving": cost,
    }
