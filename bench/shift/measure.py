"""The shift benchmark's measurements: for every source, shift and window size, ``streams`` seeded windows, and on
each the label-free estimates of ``calibkit`` against what the labels show; the page (``render``) says what each
figure means.

On a window of served probabilities p, pi_s the reference's mean calibrated probabilities: ``plain``, the mean
confidence and its Poisson-binomial interval (Kivimäki et al. 2024); ``adapted``, p' = ``adapt_probabilities`` with w
= pi_em / pi_s, EM's priors (Saerens et al. 2002); ``carried``, ``estimate_adapted_accuracy``'s interval, which
carries EM's bootstrap error; EM's and BBSE's (Lipton et al. 2018) priors against the window's class frequencies; the
oracle, p adapted with the true w = pi_t / pi_true (Alexandari et al. 2020's comparison), the error no label-free
estimate avoids; CBPE (``cbpe.py``); the rows of ``alarm`` and ``sets``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, clopper_pearson
from bench.shift import alarm, sets
from bench.shift.streams import Scenario, Source, Windows, draw_windows, scenarios, share, sources
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
    """Every per-window figure of one window; with ``carry`` the carried interval, with ``exact`` its error."""
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
        **{f"nll_{name}": metrics.nll(q, y) for name, q in (("plain", p), ("adapted", adapted), ("oracle", oracle))},
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
    exact = carry and n <= EXACT_WINDOW
    per = [
        window_measures(pool.probs[i], pool.labels[i], p, source, pi_s, confusion, carry, exact and j < EXACT_CHECKS)
        for j, (i, p) in enumerate(zip(windows.index, windows.priors))
    ]
    keys = dict.fromkeys(key for w in per for key in w)  # ``carried_error`` is on the first windows only
    v = {key: np.array([w[key] for w in per if key in w]) for key in keys}
    realized, adapted = v["realized"], v["realized_adapted"]

    def covered(interval: str, truth: np.ndarray, widen: float = 0.0) -> np.ndarray:
        lower, upper = v[f"{interval}_lower"] - widen, v[f"{interval}_upper"] + widen
        return (lower <= truth + 1e-12) & (truth <= upper + 1e-12)

    def cover(interval: str, truth: np.ndarray) -> dict:
        """The share of windows whose ``interval`` holds ``truth`` (with its Clopper-Pearson interval), its width."""
        held = covered(interval, truth)
        return {
            f"cover_{interval}": float(held.mean()),
            f"cover_{interval}_ci": clopper_pearson(int(held.sum()), streams),
            f"width_{interval}": float((v[f"{interval}_upper"] - v[f"{interval}_lower"]).mean()),
        }

    carried = {}
    if carry:
        carried = cover("carried", adapted)
        carried["carried_error"] = float(v["carried_error"].max()) if "carried_error" in v else None
    means = ("accuracy_oracle", "em_l1", "bbse_l1", "freq_l1", "nll_plain", "nll_adapted", "nll_oracle")
    row = carried | {key: float(v[key].mean()) for key in means}
    row |= {
        "source": source.name,
        "shift": scenario.shift,
        "condition": scenario.condition,
        "alpha": "" if scenario.alpha is None else scenario.alpha,
        "n": n,
        "streams": streams,
        "accuracy": float(realized.mean()),
        "accuracy_adapted": float(adapted.mean()),
        "accuracy_gap": float((v["accuracy_oracle"] - adapted).mean()),
        "bias_plain": float((v["plain"] - realized).mean()),
        "bias_adapted": float((v["adapted"] - adapted).mean()),
        "mae_plain": float(np.abs(v["plain"] - realized).mean()),
        "mae_adapted": float(np.abs(v["adapted"] - adapted).mean()),
        "mae_served_adapted": float(np.abs(v["served_adapted"] - realized).mean()),
        "mae_oracle": float(np.abs(v["served_oracle"] - realized).mean()),
        "dev_plain": float(np.abs(v["plain"] - v["served_oracle"]).mean()),
        "dev_served_adapted": float(np.abs(v["served_adapted"] - v["served_oracle"]).mean()),
        **cover("plain", realized),
        **cover("adapted", adapted),
        "cover_widened_ece": float(covered("plain", realized, error["ece_upper"]).mean()),
        "cover_widened_gap": float(covered("plain", realized, error["gap_upper"]).mean()),
        "cover_adapted_widened_ece": float(covered("adapted", adapted, error["ece_upper"]).mean()),
        "em_unconverged": int((~v["em_converged"].astype(bool)).sum()),
        "nll_ratio": row["nll_adapted"] / row["nll_oracle"] - 1.0,
        "nll_recovered": None
        if scenario.alpha is None  # no gain to recover
        else share(row["nll_plain"] - row["nll_adapted"], row["nll_plain"] - row["nll_oracle"]),
        "_realized": realized,
        "_expected": v["served_oracle"],
    }
    return row, windows


def cbpe_estimates(
    all_sources: list[Source], cases: list[tuple[int, str, np.ndarray]]
) -> tuple[list[np.ndarray] | None, str]:
    """CBPE's estimated accuracy of each case's windows, run by ``cbpe.py`` in .venv-cbpe; (None, why) when it fails."""
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
        for scenario, n in itertools.product(scenarios(source), args.windows):
            seed += 1
            row, windows = measure_row(source, scenario, n, args.streams, seed, errors[source.name])
            rows.append(row)
            cases.append((s, scenario.condition, windows.index))
            print(
                f"{source.name} {scenario.shift} {scenario.condition} {row['alpha']} n={n}: mae {row['mae_plain']:.4f}"
                f" / adapted {row['mae_adapted']:.4f}, cover {row['cover_plain']:.3f}",
                flush=True,
            )
    length = getattr(args, "alarm_length", alarm.ALARM_LENGTH)
    alarm_rows, set_rows = [], []
    for s, source in enumerate(all_sources):
        alarm_rows += alarm.alarm_rows(source, args.streams, length, args.seed + 1_000 * (s + 1))
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
            row["dev_cbpe_ratio"] = share(row["dev_served_adapted"], row["dev_cbpe"])
            row["cbpe_ratio"] = share(row["mae_served_adapted"], row["mae_cbpe"])
            row["plain_cbpe_ratio"] = share(row["mae_plain"], row["mae_cbpe"])
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
