"""The benchmark of the miscalibration alarm (``python -m bench.alarm``, docs/alarm_benchmark.md): ``measure.run``
measures; ``simulation`` runs the detector on many synthetic streams at once and ``oracle`` is the yardstick, a CUSUM
told the shift (they serve the benchmark, the tests and the scripts, never training or serving, so they live here).

    python -m bench.alarm [--streams 400] [--labels 10000] [--smoke] [--skip-http] [--report-only]
"""

from __future__ import annotations

from bench.alarm import goals, measure, render
from bench.common import Benchmark, flags

arguments = flags(
    streams=(400, "streams per null row"),
    shift_streams=(200, "streams per shift row"),
    oracle_streams=(500, "streams that tune each oracle's levels"),
    labels=10_000,
    warning_predictions=100_000,
    skip_http=(False, "only the simulations (no service processes)"),
)


def run(args) -> dict:
    if args.smoke:
        args.streams, args.shift_streams, args.oracle_streams, args.labels = 10, 4, 8, 1_000
        args.warning_predictions = 10_000
    return measure.run(args)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
