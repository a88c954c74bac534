"""Serving benchmark: raw onnxruntime, the service and the no-batching baseline side by side, plus
monitoring latency and a memory soak on the same long-lived service process.

``measure.run`` says what is measured. Goals are ratios within this one run (``goals``), and those of the device
the heavy model really ran on (``/health``): ``--device cuda`` on a machine with a GPU and onnxruntime-gpu runs the
same benchmark with the GPU goals. Prints tables (``render``); writes serving.json, monitoring.json, soak.json.

    python -m bench.serving [--seconds 4] [--soak-minutes 10] [--rows 1000000] [--device cuda] [--smoke]
    python -m bench.serving --heavy-only    # the heavy model's rounds alone
"""

from __future__ import annotations

import argparse

from bench.common import write_result
from bench.serving import measure
from bench.serving.goals import goals
from bench.serving.render import heavy_report, report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per load point")
    parser.add_argument(
        "--soak-minutes", type=float, default=10.0, help="minutes of load on one process, for the RSS check"
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="labelled predictions stored before the start")
    parser.add_argument("--smoke", action="store_true", help="one short point per case (CI: the script runs)")
    parser.add_argument(
        "--heavy-only",
        action="store_true",
        help="only the heavy model's rounds (JSON and binary v2 against onnxruntime alone), a short run "
        "for iterating on the hot path",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="the service's and the baseline's device (CALIB_DEVICE); on cuda the batcher may form "
        f"batches of {measure.GPU_MAX_BATCH} rows",
    )
    args = parser.parse_args()
    device = args.device
    smoke = args.smoke
    if args.heavy_only:
        heavy = measure.heavy_only(args.seconds, 1 if smoke else 3, device)
        print(heavy_report(heavy, "the machine's provider"))
        write_result("serving_heavy", heavy, smoke=smoke)
        return
    seconds = 1.0 if smoke else args.seconds
    concurrency = (4,) if smoke else (1, 4, 16, 64)
    request_rows = (1,) if smoke else (1, 32)
    stored_rows, soak_minutes = (5_000, 0.1) if smoke else (args.rows, args.soak_minutes)
    measured = measure.run(seconds, concurrency, request_rows, stored_rows, soak_minutes, smoke, device)
    write_result("monitoring", measured.monitoring, smoke=smoke)
    write_result("soak", measured.soak, smoke=smoke)
    result, calibration, memory = measured.serving, measured.monitoring["calibration"], measured.soak
    result["goals"] = goals(result, concurrency[-1], calibration, measured.monitoring["feedback"], memory)
    print(report(result, calibration, memory))
    write_result("serving", result, smoke=smoke)


if __name__ == "__main__":
    main()
