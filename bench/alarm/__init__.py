"""The benchmark of the miscalibration alarm (``python -m bench.alarm``, docs/alarm_benchmark.md) and what it is
measured with.

``measure.run`` says what is measured, ``goals`` judges it, ``render`` writes the page. ``calibkit.synthetic`` draws
the synthetic predictions of known calibration, ``simulation`` runs the detector of ``calibkit.detector`` on many such
streams at once, and ``oracle`` is the yardstick: a CUSUM told the shift. They serve the benchmark, the tests and the
scripts, never training or serving, so they live here, not in calibkit.

    python -m bench.alarm [--streams 400] [--labels 10000] [--smoke] [--skip-http] [--report-only]
"""

from __future__ import annotations

from bench.alarm import goals, measure, render
from bench.common import Benchmark


def arguments(parser) -> None:
    parser.add_argument("--streams", type=int, default=400, help="streams per null row")
    parser.add_argument("--shift-streams", type=int, default=200, help="streams per shift row")
    parser.add_argument("--oracle-streams", type=int, default=500, help="streams that tune each oracle's levels")
    parser.add_argument("--labels", type=int, default=10_000)
    parser.add_argument("--warning-predictions", type=int, default=100_000)
    parser.add_argument("--skip-http", action="store_true", help="only the simulations (no service processes)")


def run(args) -> dict:
    if args.smoke:
        args.streams, args.shift_streams, args.oracle_streams, args.labels = 10, 10, 20, 1_000
        args.warning_predictions = 10_000
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
