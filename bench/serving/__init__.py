"""The serving benchmark (``python -m bench.serving``, part of ``make bench``): onnxruntime alone, the service and the
no-batching baseline side by side, the floor apps, the prediction log's cost, and monitoring latency and a memory
soak on the same long-lived service process. ``measure`` runs the servers and the load, ``goals`` judges the
results, ``render`` writes them.

Goals are ratios within this one run, and those of the device the heavy model really ran on (``/health``):
``--device cuda`` on a machine with a GPU and onnxruntime-gpu runs the same benchmark with the GPU goals. The device
run (``--device-run``, ``device``) is the short one of the serving path on a device, ``--engine`` (``pod``) the pod of
front-ends and its engine on one; both write under ``--out`` (``python -m bench.gpu`` is their former name).

    python -m bench.serving [--seconds 3] [--soak-minutes 10] [--rows 1000000] [--device cuda] [--smoke]
    python -m bench.serving --heavy-only    # the heavy model's rounds alone
    python -m bench.serving --prepare DIR   # the two-model repository (needs torch), to carry to a GPU machine
    python -m bench.serving --device-run --out DIR [--artifacts DIR] [--device cuda] [--smoke]
    python -m bench.serving --engine --out DIR --artifacts DIR [--device cuda] [--frontends 1,4,12] [--no-replicas]
    python -m bench.serving --engine --before DIR --out DIR --artifacts DIR [--frontends 12]   # new against DIR
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.common import Benchmark, write_result
from bench.serving import goals, measure, render


def arguments(parser) -> None:
    parser.add_argument("--seconds", type=float, help="measured seconds per load point (3; 4 in the device runs)")
    parser.add_argument(
        "--soak-minutes", type=float, default=10.0, help="minutes of load on one process, for the RSS check"
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="labelled predictions stored before the start")
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
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="only write the two-model repository to DIR")
    parser.add_argument("--device-run", action="store_true", help="the short device run (bench/serving/device.py)")
    parser.add_argument("--engine", action="store_true", help="the pod on the device (bench/serving/pod.py)")
    parser.add_argument("--out", type=Path, help="with --device-run or --engine: the directory of their results")
    parser.add_argument("--artifacts", type=Path, help="the two-model repository of --prepare (default: built here)")
    parser.add_argument("--frontends", default="1,4,12", help="with --engine: the numbers of front-ends, W")
    parser.add_argument("--deadline", type=float, default=3.2, help="with --engine: minutes after which no W starts")
    parser.add_argument("--no-replicas", action="store_true", help="with --engine: skip the two plain replicas")
    parser.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="with --engine: this tree's engine against the source tree DIR's, at the first W (bench/serving/limit.py)",
    )


def run(args) -> dict | None:
    """The mode the flags name; the device runs, the repository and the heavy rounds write their own output."""
    if args.prepare:
        work = Path(tempfile.mkdtemp(prefix="calib-gpu-"))
        shutil.rmtree(args.prepare, ignore_errors=True)
        shutil.copytree(measure.both_artifacts(work), args.prepare)
        shutil.rmtree(work, ignore_errors=True)
        print("two-model repository in", args.prepare)
        return None
    seconds = 1.0 if args.smoke else args.seconds
    if args.engine or args.device_run:
        if args.out is None:
            raise SystemExit("--out is required with --device-run and --engine (or --prepare)")
        if args.engine and args.before:
            from bench.serving import limit

            w = int(args.frontends.split(",")[0])
            print(limit.report(limit.run(args.out, args.device, args.artifacts, seconds or 4.0, args.before, w)))
        elif args.engine:
            from bench.serving import pod

            frontends = tuple(int(w) for w in args.frontends.split(","))
            replicas = not args.no_replicas
            result = pod.run(args.out, args.device, args.artifacts, seconds or 4.0, frontends, args.deadline, replicas)
            print(pod.report(result))
        else:
            from bench.serving import device

            print(device.report(device.run(args.out, args.device, args.artifacts, seconds or 4.0)))
        return None
    seconds = seconds or 3.0
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
