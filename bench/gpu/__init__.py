"""The device runs, in one command each (``python -m bench.gpu``; decisions 0001 and 0027), and the rendering of
every recorded run (``recorded_section``, docs/benchmarks.md's GPU section, from docs/benchmarks/gpu/*.json).

    python -m bench.gpu --prepare DIR                    # the two-model repository (needs torch), to carry
    python -m bench.gpu --out DIR --artifacts DIR [--device cuda]
    python -m bench.gpu --out DIR --device cpu --smoke   # the rehearsal: a quarter second a point (wrk: 1 s)
    python -m bench.gpu --engine --out DIR --artifacts DIR --seconds 2 [--frontends 1,4,12] [--no-replicas]
    python -m bench.gpu --engine --before .before --frontends 12 --out DIR --artifacts DIR   # issue 65's table
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from bench.common import ROOT, table
from bench.gpu.device import run_device, run_report, v2_binary_outputs
from bench.gpu.limit import limit_goals, limit_report, run_limit, timeline
from bench.gpu.pod import grpc_connections, pod_report, point, run_pod
from bench.serving.harness import both_artifacts

__all__ = ["grpc_connections", "limit_goals", "point", "timeline", "v2_binary_outputs"]  # imported from here
RECORDED = ROOT / "docs" / "benchmarks" / "gpu"
HEADING = "## GPU runs (`python -m bench.gpu`)"
SWEEP_COLUMNS = ["round", "setting", "ready_seconds", "rows_per_s", "batch", "queue_ms", "inference_ms"]
REPORTS = {"engine": pod_report, "limit": limit_report}
"""The report of each recorded ``kind`` of run beside the device run's (``run_report``)."""


def recorded_section(folder: Path = RECORDED) -> str:
    """docs/benchmarks.md's GPU section: every recorded run and settings sweep, by session, then by name."""
    out = [
        HEADING,
        "",
        "Recorded on lent GPU machines (the run is one command, `python -m bench.gpu --device cuda`, and "
        "`--engine` for the pod; docs/decisions/0001-gpu-run.md, 0020-bucket-sessions.md and 0027-engine-process.md "
        "say what was learnt). Each run's settings are named above its tables.",
    ]
    recorded = [(path, json.loads(path.read_text())) for path in folder.glob("*.json")]
    for path, data in sorted(recorded, key=lambda r: (r[1]["recorded"].get("session", 1), r[0].name)):
        note = f"\n*{path.name}: {data['recorded']['note']}.*\n"
        kind = data["recorded"].get("kind")
        if kind in REPORTS:
            text = REPORTS[kind](data).replace("## The engine", f"## GPU run {path.stem}: the engine", 1)
        elif "settings" not in data:
            text = run_report(data).replace("## GPU run", f"## GPU run {path.stem},", 1)
        else:
            columns = [c for c in SWEEP_COLUMNS if c in data["settings"][0]]
            out += [f"\n## GPU settings sweep ({path.stem})", note, table(data["settings"], columns)]
            if data.get("batcher_alone"):
                out += ["", "The service's batcher and sessions alone (no HTTP), at the same load:", ""]
                out.append(table(data["batcher_alone"], "sessions provider rows_per_s batch onnxruntime_ms"))
            out += ["", "onnxruntime alone at batch 32, beside a pure-Python thread:", ""]
            out.append(
                table(data["gil"], "python_thread_busy switch_interval_ms batch sessions rows_per_s ms_per_call")
            )
            continue
        out.append("\n" + text.replace("\n", "\n" + note, 1).replace("\n### ", "\n#### "))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.gpu``: the run the flags name."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="only write the two-model repository to DIR")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cuda", help="the service's device")
    parser.add_argument("--engine", action="store_true", help="the pod on the device (run_pod)")
    parser.add_argument("--out", type=Path, help="the directory of the run's results")
    parser.add_argument("--artifacts", type=Path, help="the two-model repository of --prepare (default: built here)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per load point")
    parser.add_argument("--smoke", action="store_true", help="a quarter second per point: the rehearsal")
    parser.add_argument("--frontends", default="1,4,12", help="with --engine: the numbers of front-ends, W")
    parser.add_argument("--deadline", type=float, default=3.2, help="with --engine: minutes after which no W starts")
    parser.add_argument("--no-replicas", action="store_true", help="with --engine: skip the two plain replicas")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="with --engine: this tree's engine against the source tree DIR's"
    )
    args = parser.parse_args(argv)
    if args.prepare:
        with tempfile.TemporaryDirectory(prefix="calib-gpu-") as work:
            shutil.rmtree(args.prepare, ignore_errors=True)
            shutil.copytree(both_artifacts(Path(work)), args.prepare)
        print("two-model repository in", args.prepare)
        return
    if args.out is None:
        parser.error("--out is required (or --prepare)")
    seconds, os.environ["BENCH_SMOKE"] = (0.25, "1") if args.smoke else (args.seconds, "")
    frontends = tuple(int(w) for w in args.frontends.split(","))
    if args.engine and args.before:
        print(limit_report(run_limit(args.out, args.device, args.artifacts, seconds, args.before, frontends[0])))
    elif args.engine:
        result = run_pod(args.out, args.device, args.artifacts, seconds, frontends, args.deadline, not args.no_replicas)
        print(pod_report(result))
    else:
        print(run_report(run_device(args.out, args.device, args.artifacts, seconds)))
