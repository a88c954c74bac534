"""The benchmark of label-free accuracy estimation and label-shift correction (``python -m bench.shift``,
docs/shift_benchmark.md): windows of the digits model and synthetic sources under no shift, label shift, covariate
shift and both, against their labels, an oracle told the priors, and NannyML's CBPE (``cbpe.py``, `make cbpe`).

    python -m bench.shift [--streams 200] [--windows 500,2000] [--alarm-length 10000] [--seed 0] [--smoke]
        [--report-only]
"""

from __future__ import annotations

from bench.common import Benchmark, flags
from bench.shift import goals, measure, render
from bench.shift.alarm import ALARM_LENGTH
from bench.shift.streams import POOL_ROWS

arguments = flags(
    streams=(200, "seeded windows per row"),
    windows=(measure.WINDOWS, "window sizes, comma-separated", lambda text: tuple(int(v) for v in text.split(","))),
    seed=0,
    pool_rows=(POOL_ROWS, "rows of each synthetic pool"),
    serving_seconds=(4.0, "seconds of load per version, round and request size"),
    serving_rounds=(5, "alternating rounds of the /predict cost"),
    alarm_length=(ALARM_LENGTH, "predictions per alarm stream"),
)


def run(args) -> dict:
    if args.streams < 2 or min(args.windows) < 10 or args.alarm_length < 1:
        raise SystemExit(f"--streams: expected at least 2, --windows at least 10, got {args.streams}, {args.windows}")
    if args.smoke:
        args.streams, args.pool_rows, args.alarm_length = 4, 20_000, 2_000
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
