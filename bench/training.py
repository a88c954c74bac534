"""Training benchmark: wall time and peak memory (max RSS) of the default `python -m training run`.

python -m bench.training [--smoke]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import PYTHON, ROOT, table, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 epochs and few resamples")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="calib-bench-train-"))
    extra = ["--epochs", "2", "--n-resamples", "20", "--n-resamples-shifted", "10"] if args.smoke else []
    start = time.perf_counter()
    subprocess.run(
        [
            PYTHON,
            "-m",
            "training",
            "run",
            "--no-progress",
            "--run-dir",
            str(work / "run"),
            "--artifacts",
            str(work / "artifacts"),
            *extra,
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    shutil.rmtree(work, ignore_errors=True)
    row = {
        "job": "training run (digits, LeNet-5, CE + temperature)" + (" smoke" if args.smoke else ""),
        "seconds": seconds,
        "peak_rss_mib": peak_mib,
    }
    print(table([row], ["job", "seconds", "peak_rss_mib"]))
    write_result("training", row, smoke=args.smoke)


if __name__ == "__main__":
    main()
