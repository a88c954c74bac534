"""Wall time and peak memory (max RSS) of the default `python -m training run`.

python -m bench.training [--smoke]   (--smoke: 2 epochs and few resamples)
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
import time

from bench.common import PYTHON, ROOT, Benchmark, table


def measure(args) -> dict:
    extra = ["--epochs", "2", "--n-resamples", "20", "--n-resamples-shifted", "10"] if args.smoke else []
    with tempfile.TemporaryDirectory(prefix="calib-bench-train-") as work:
        start = time.perf_counter()
        subprocess.run(
            [PYTHON, "-m", "training", "run", "--no-progress", "--run-dir", f"{work}/run", "--artifacts", f"{work}/a"]
            + extra,
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        seconds = time.perf_counter() - start
    return {
        "job": "training run (digits, LeNet-5, CE + temperature)" + (" smoke" if args.smoke else ""),
        "seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def render(result: dict) -> str:
    return f"## Training: the default `python -m training run`\n\n{table([result], 'job seconds peak_rss_mib')}\n"


BENCHMARK = Benchmark(measure, lambda result: [], render)
