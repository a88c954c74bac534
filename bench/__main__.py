"""Every benchmark of the registry (bench/registry.py) in turn, each in a process of its own, each timed.

Prints how long each took; each result records its own wall time, which docs/benchmarks.md shows.

    python -m bench [--smoke] [--only NAME ...] [--device cuda]   (make bench; --smoke: seconds each, no page)
"""

import argparse
import subprocess
import sys
import time

from bench.common import ROOT, table
from bench.registry import PAGES

parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n")[0])
parser.add_argument("--smoke", action="store_true", help="every benchmark's short run (no page is written)")
parser.add_argument(
    "--only", nargs="+", choices=list(PAGES), default=list(PAGES), metavar="NAME", help=", ".join(PAGES)
)
parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="the serving benchmark's")
args = parser.parse_args()
times = []
for name in args.only:
    print(f"\n=== {name}", flush=True)
    start = time.perf_counter()
    extra = ["--device", args.device] if name == "serving" else []
    subprocess.run([sys.executable, "-m", f"bench.{name}", *extra, *(["--smoke"] * args.smoke)], check=True, cwd=ROOT)
    times.append({"benchmark": name, "seconds": time.perf_counter() - start})
print("\n" + table(times, "benchmark seconds"))
