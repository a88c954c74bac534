"""The benchmark of conformal prediction sets (``python -m bench.conformal``, docs/conformal_benchmark.md): split
conformal on exchangeable data (coverage against its exact law, set sizes, coverage by set size and class), the cost
per batch and in the service's /predict, adaptive sets under shift and the coverage alarm, of ``calibkit.conformal``.

``measure.run`` says what is measured, ``goals`` judges it, ``render`` writes the page.

    python -m bench.conformal [--splits 1000] [--repeats 1000] [--seed 0] [--serving-seconds 4]
        [--serving-rounds 7] [--e2e-streams 5] [--e2e-shift-streams 2] [--smoke] [--report-only]
"""

from __future__ import annotations

from bench.common import Benchmark
from bench.conformal import goals, measure, render


def arguments(parser) -> None:
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


def run(args) -> dict:
    for flag, least in (("splits", 2), ("repeats", 1), ("serving_seconds", 1), ("serving_rounds", 1)):
        if getattr(args, flag) < least:
            raise SystemExit(f"--{flag.replace('_', '-')}: expected at least {least}, got {getattr(args, flag)}")
    if args.smoke:
        args.splits, args.repeats, args.e2e_streams, args.e2e_shift_streams = 20, 20, 1, 1
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
