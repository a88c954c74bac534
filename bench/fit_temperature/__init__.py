"""Time of calibkit.temperature.fit_temperature (and the ECE grid search) on N samples.

python -m bench.fit_temperature [--n 100000] [--classes 10] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import time

import numpy as np

from bench.common import Benchmark, flags, table
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import fit_temperature

COLUMNS = "objective n classes fitted_T best_s median_s".split()


def measure(args) -> dict:
    """Temperature scaling fitted to logits of true temperature 2.5: NLL ``--repeats`` times, the ECE search once."""
    n, repeats = (10_000, 1) if args.smoke else (args.n, args.repeats)
    z, y = calibrated_logits(n, n_classes=args.classes, seed=0)
    rows = []
    for objective, times_run in (("nll", repeats), ("ece", 1)):
        times = []
        for _ in range(times_run):
            start = time.perf_counter()
            t = fit_temperature(2.5 * z, y, objective=objective)
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "objective": objective,
                "n": n,
                "classes": args.classes,
                "fitted_T": round(t, 4),
                "true_T": 2.5,
                "best_s": min(times),
                "median_s": float(np.median(times)),
            }
        )
    return {"results": rows}


def render(result: dict) -> str:
    return f"## fit_temperature\n\n{table(result['results'], COLUMNS)}\n"


BENCHMARK = Benchmark(measure, lambda result: [], render, flags(n=100_000, classes=10, repeats=5))
