"""Benchmark of the miscalibration alarm itself (``make bench-alarm``), against an oracle.

Measures (``measure.run`` says what), judges the goals (``goals``), prints the tables and writes
bench/results/alarm.json and docs/alarm_benchmark.md (``render``).

    python -m bench.alarm [--streams 400] [--labels 10000] [--smoke] [--skip-http]
"""

from __future__ import annotations

import argparse

from bench.alarm.goals import goals
from bench.alarm.measure import run
from bench.alarm.render import PAGE, markdown
from bench.common import publish


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.alarm", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=400, help="streams per null row")
    parser.add_argument("--shift-streams", type=int, default=200, help="streams per shift row")
    parser.add_argument("--oracle-streams", type=int, default=500, help="streams that tune each oracle's levels")
    parser.add_argument("--labels", type=int, default=10_000)
    parser.add_argument("--warning-predictions", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--skip-http", action="store_true", help="only the simulations (no service processes)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite docs/alarm_benchmark.md from bench/results/alarm.json, goals recomputed",
    )
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.shift_streams, args.oracle_streams, args.labels = 20, 20, 50, 1_000
        args.warning_predictions = 10_000
    publish("alarm", lambda: run(args), goals, markdown, PAGE, args.smoke, args.report_only)


if __name__ == "__main__":
    main()
