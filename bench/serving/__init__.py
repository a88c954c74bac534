"""The serving benchmark (``python -m bench.serving``, part of ``make bench``): onnxruntime alone, the service and the
no-batching baseline side by side, the floor apps, the prediction log's cost, and monitoring latency and a memory
soak on the same long-lived service process.

Goals are ratios within this one run, and those of the device the heavy model really ran on (``/health``); the short
runs of the serving path on a device are ``python -m bench.gpu``.

    python -m bench.serving [--seconds 3] [--soak-minutes 10] [--rows 1000000] [--device cuda] [--smoke]
    python -m bench.serving --heavy-only    # the heavy model's rounds alone
"""

from __future__ import annotations

from bench.common import GPU_MAX_BATCH, Benchmark, flags, write_result
from bench.serving import goals, measure, render


def arguments(parser) -> None:
    flags(
        seconds=(None, "measured seconds per load point (3)", float),
        soak_minutes=(10.0, "minutes of load on one process, for the RSS check"),
        rows=(1_000_000, "labelled predictions stored before the start"),
        heavy_only=(
            False,
            "only the heavy model's rounds (JSON and binary v2 against onnxruntime alone), a short run "
            "for iterating on the hot path",
        ),
    )(parser)
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="the service's and the baseline's device (CALIB_DEVICE); on cuda the batcher may form "
        f"batches of {GPU_MAX_BATCH} rows",
    )


def run(args) -> dict | None:
    """The mode the flags name; the heavy rounds write their own output."""
    seconds = (0.25 if args.smoke else args.seconds) or 3.0  # smoke: wrk still runs its least, 1 s
    if args.heavy_only:
        heavy = measure.heavy_only(seconds, 1 if args.smoke else 3, args.device)
        print(render.heavy_report(heavy, "the machine's provider"))
        write_result("serving_heavy", heavy, smoke=args.smoke)
        return None
    concurrency = (4,) if args.smoke else (1, 4, 16, 64)
    request_rows = (1,) if args.smoke else (1, 32)
    stored_rows, soak_minutes = (5_000, 0.1) if args.smoke else (args.rows, args.soak_minutes)
    return measure.run(seconds, concurrency, request_rows, stored_rows, soak_minutes, args.smoke, args.device)


BENCHMARK = Benchmark(run, goals.goals, render.markdown, arguments)
