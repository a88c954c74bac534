"""Benchmark: time of calibkit.temperature.fit_temperature (and the ECE grid search) on N samples.

Prints a table and writes bench/results/fit_temperature.json. Usage:
    python bench/fit_temperature.py [--n 100000] [--classes 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from calibkit.synthetic import calibrated_logits
from calibkit.temperature import fit_temperature


def _machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "commit": commit or None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fit_temperature.json")
    args = parser.parse_args()

    z, y = calibrated_logits(args.n, n_classes=args.classes, seed=0)
    rows = []
    for objective, repeats in (("nll", args.repeats), ("ece", 1)):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            t = fit_temperature(2.5 * z, y, objective=objective)
            times.append(time.perf_counter() - start)
        rows.append({"objective": objective, "n": args.n, "classes": args.classes, "fitted_T": round(t, 4),
                     "true_T": 2.5, "best_s": round(min(times), 4), "median_s": round(float(np.median(times)), 4)})

    print(f"{'objective':<10}{'N':>9}{'K':>4}{'fitted T':>10}{'best s':>9}{'median s':>10}")
    for r in rows:
        print(f"{r['objective']:<10}{r['n']:>9}{r['classes']:>4}{r['fitted_T']:>10}{r['best_s']:>9}{r['median_s']:>10}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": _machine(), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
