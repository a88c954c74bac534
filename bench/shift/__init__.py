"""The benchmark of label-free accuracy estimation and label-shift correction (``python -m bench.shift``,
docs/shift_benchmark.md): on the digits model and synthetic sources of known calibration, windows under no shift,
label shift (Dirichlet priors), covariate shift and both, measured against their labels, an oracle told the priors,
and NannyML's CBPE.

``streams`` builds the sources and windows, ``measure`` measures them (with ``alarm``, the label-shift alarm's
streams, and ``sets``, the prediction sets under label shift), ``goals`` judges, ``render`` writes the page;
``cbpe.py`` runs CBPE in .venv-cbpe (`make cbpe`).

    python -m bench.shift [--streams 200] [--windows 500,2000] [--alarm-length 10000] [--seed 0] [--smoke]
        [--report-only]
"""

from __future__ import annotations

from bench.common import Benchmark
from bench.shift import goals, measure, render
from bench.shift.alarm import ALARM_LENGTH
from bench.shift.streams import POOL_ROWS


def arguments(parser) -> None:
    parser.add_argument("--streams", type=int, default=200, help="seeded windows per row")
    parser.add_argument(
        "--windows",
        type=lambda text: tuple(int(v) for v in text.split(",")),
        default=measure.WINDOWS,
        help="window sizes, comma-separated",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-rows", type=int, default=POOL_ROWS, help="rows of each synthetic pool")
    parser.add_argument(
        "--serving-seconds", type=float, default=4.0, help="seconds of load per version, round and request size"
    )
    parser.add_argument("--serving-rounds", type=int, default=5, help="alternating rounds of the /predict cost")
    parser.add_argument("--alarm-length", type=int, default=ALARM_LENGTH, help="predictions per alarm stream")


def run(args) -> dict:
    if args.streams < 2 or min(args.windows) < 10 or args.alarm_length < 1:
        raise SystemExit(f"--streams: expected at least 2, --windows at least 10, got {args.streams}, {args.windows}")
    if args.smoke:
        args.streams, args.pool_rows, args.alarm_length = 20, 20_000, 2_000
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
