"""The benchmark of conformal prediction sets (``python -m bench.conformal``, docs/conformal_benchmark.md) of
``calibkit.conformal``: split conformal on exchangeable data, the cost per batch and in /predict, adaptive sets under
shift and the coverage alarm.

    python -m bench.conformal [--splits 1000] [--repeats 1000] [--seed 0] [--serving-seconds 4]
        [--serving-rounds 7] [--e2e-streams 5] [--e2e-shift-streams 2] [--smoke] [--report-only]
"""

from __future__ import annotations

from bench.common import Benchmark, flags
from bench.conformal import goals, measure, render

arguments = flags(
    splits=(1_000, "random calibration/test splits per data set"),
    repeats=(1_000, "timed calls per method and operation"),
    seed=0,
    serving_seconds=(4.0, "seconds of load per version, round and request size"),
    serving_rounds=(7, "alternating rounds of sets in /predict"),
    e2e_streams=(5, "exchangeable streams through the service per data set and delay"),
    e2e_shift_streams=(2, "shifted streams through the service per data set and delay"),
)


def run(args) -> dict:
    for flag, least in (("splits", 2), ("repeats", 1), ("serving_seconds", 1), ("serving_rounds", 1)):
        if getattr(args, flag) < least:
            raise SystemExit(f"--{flag.replace('_', '-')}: expected at least {least}, got {getattr(args, flag)}")
    if args.smoke:
        args.splits, args.repeats, args.e2e_streams, args.e2e_shift_streams = 5, 20, 1, 1
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
