"""Benchmark of conformal prediction sets (``make bench-conformal``).

Split conformal on exchangeable data, adaptive sets under shift, the coverage alarm, and the cost of sets per
batch and in the service's /predict.

Measures (``measure.run`` says what), judges the goals (``goals``), prints the tables and writes
bench/results/conformal.json and docs/conformal_benchmark.md (``render``).

    python -m bench.conformal [--splits 1000] [--repeats 1000] [--seed 0] [--serving-seconds 4]
        [--serving-rounds 7] [--e2e-streams 5] [--e2e-shift-streams 2] [--smoke]
"""

from __future__ import annotations

import argparse

from bench.common import publish
from bench.conformal.goals import goals
from bench.conformal.measure import run
from bench.conformal.render import PAGE, markdown


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conformal", description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=1_000, help="random calibration/test splits per data set")
    parser.add_argument("--repeats", type=int, default=1_000, help="timed calls per method and operation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--serving-seconds", type=float, default=4.0, help="seconds of load per version, round and request size"
    )
    parser.add_argument("--serving-rounds", type=int, default=7, help="alternating rounds of sets in /predict")
    parser.add_argument(
        "--e2e-streams", type=int, default=5, help="exchangeable streams through the service per data set and delay"
    )
    parser.add_argument(
        "--e2e-shift-streams", type=int, default=2, help="shifted streams through the service per data set and delay"
    )
    parser.add_argument("--smoke", action="store_true", help="a few-second run that checks the benchmark works")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite docs/conformal_benchmark.md from bench/results/conformal.json, goals recomputed",
    )
    args = parser.parse_args()
    if args.splits < 2:
        parser.error(f"--splits: expected at least 2, got {args.splits}")
    if args.repeats < 1:
        parser.error(f"--repeats: expected at least 1, got {args.repeats}")
    if args.serving_seconds < 1 or args.serving_rounds < 1:
        parser.error(
            f"--serving-seconds, --serving-rounds: expected at least 1, got {args.serving_seconds}, "
            f"{args.serving_rounds}"
        )
    if args.smoke:
        args.splits, args.repeats, args.e2e_streams, args.e2e_shift_streams = 20, 20, 1, 1
    publish("conformal", lambda: run(args), goals, markdown, PAGE, args.smoke, args.report_only)


if __name__ == "__main__":
    main()
