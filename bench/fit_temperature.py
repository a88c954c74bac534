"""Benchmark: time of calibkit.temperature.fit_temperature (and the ECE grid search) on N samples.

python -m bench.fit_temperature [--n 100000] [--classes 10] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import table, write_result
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import fit_temperature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
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
    print(table(rows, ["objective", "n", "classes", "fitted_T", "true_T", "best_s", "median_s"]))
    write_result("fit_temperature", {"results": rows}, smoke=args.smoke)


if __name__ == "__main__":
    main()
