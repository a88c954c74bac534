"""The engine's IPC cost (``python -m bench.engine``, docs/engine_benchmark.md).

The same single-row requests to the committed light model go through the in-process dynamic batcher (today's
path, W = 1) and through an engine process over ZeroMQ (``service.engine``), one at a time and 64 in flight. A
``null`` model (no inference: zeros back at once) isolates the IPC itself. Reported: the round trip p50 and p99,
and the CPU per request of each process (this front-end process; the engine's from /proc), summed.

Then the whole service at W = 1 and W = 2 (``CALIB_FRONTENDS``) under wrk: the CPU per request summed over every
process of the service, the issue's 1.2x goal.

    python -m bench.engine [--requests 4000] [--seconds 8] [--smoke] [--report-only]
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import (
    ROOT,
    Benchmark,
    Server,
    children,
    histogram_totals,
    measured_by,
    process_cpu_seconds,
    table,
    wrk,
)

MODEL = ROOT / "artifacts" / "digits-lenet5" / "1"
IN_FLIGHT = 64
#: The issue's goal: the pod's CPU per request, summed over its processes, at W = 2 against W = 1.
CPU_RATIO = 1.2
SERVICE_COLUMNS = "frontends protocol connections requests requests_per_s cpu_us_per_request mean_batch".split()
COLUMNS = (
    "path model in_flight requests rows_per_s p50_ms p99_ms cpu_us_front cpu_us_engine cpu_us_total mean_batch".split()
)

NULL_ENGINE = """
import asyncio, signal, sys
import numpy as np
from service.engine.server import EngineServer
from service.serving.batching import DynamicBatcher
from service.settings import BatchingConfig

def run(x):
    return {"logits": np.zeros((len(x), 10), np.float32), "probabilities": np.full((len(x), 10), 0.1, np.float32)}

async def main():
    server = EngineServer({("null", "1"): DynamicBatcher([run], BatchingConfig(instances=1), "null:1")}, sys.argv[1])
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
    await server.serve()

asyncio.run(main())
"""


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live children (a pod's engine and front-ends)."""
    return process_cpu_seconds(pid) + sum(process_cpu_seconds(c) for c in children(pid))


def service_runs(seconds: float) -> list[dict]:
    """``python -m service`` at W = 1 (in process) and W = 2 (a pod) under single-row load at 64 in flight: JSON
    ``/predict`` from wrk, and gRPC ``ModelInfer`` from h2load on one HTTP/2 connection and on W; rows/s, the CPU
    per request summed over the service's processes, and the mean batch the front-ends formed."""
    from bench.serving.grpc_load import load
    from training.data import load_dataset

    body = json.dumps({"inputs": load_dataset("digits").test.x[:1].tolist()})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for frontends in (1, 2):
            env = {
                "CALIB_FRONTENDS": str(frontends),
                "CALIB_STORE__URL": f"sqlite:///{tmp}/w{frontends}.db",
                "CALIB_GRPC_PORT": "0",
            }
            server = Server([sys.executable, "-m", "service"], "/v2/health/ready", env=env)
            try:
                target = f"127.0.0.1:{httpx.get(server.url + '/health').json()['grpc_port']}"
                runs = [("json", 1, functools.partial(wrk, server.url + "/predict", body, IN_FLIGHT, seconds))]
                for connections in sorted({1, frontends}):
                    runs.append(
                        (
                            "grpc",
                            connections,
                            functools.partial(
                                load, target, "digits-lenet5", (1, 8, 8), IN_FLIGHT, seconds, connections
                            ),
                        )
                    )
                wrk(server.url + "/predict", body, IN_FLIGHT, 1.0)  # warm-up
                for protocol, connections, drive_load in runs:
                    cpu, batches = tree_cpu_seconds(server.process.pid), batch_sums(server.url)
                    got = drive_load()
                    used = tree_cpu_seconds(server.process.pid) - cpu
                    rows_, count = (a - b for a, b in zip(batch_sums(server.url), batches))
                    rows.append(
                        {
                            "frontends": frontends,
                            "protocol": protocol,
                            "connections": connections if protocol == "grpc" else IN_FLIGHT,
                            "requests": got["requests"],
                            "requests_per_s": got["requests_per_s"],
                            "cpu_us_per_request": used / got["requests"] * 1e6,
                            "mean_batch": rows_ / count if count else float("nan"),
                        }
                    )
                    print(table(rows[-1:], SERVICE_COLUMNS), flush=True)
            finally:
                server.stop()
    return rows


def batch_sums(url: str) -> tuple[float, float]:
    """Rows and batches the service's batchers have run (its ``calib_batch_size_rows`` histogram, every model)."""
    sums = [v for k, v in histogram_totals(url).items() if k.startswith("batch:")]
    return sum(s for s, _ in sums), sum(c for _, c in sums)


async def drive(submit, x: np.ndarray, requests: int, in_flight: int) -> dict:
    """``requests`` single-row submits, ``in_flight`` at a time: round trips, rows/s, mean batch."""
    latencies, batches = [], []

    async def worker(count: int) -> None:
        for i in range(count):
            started = time.perf_counter()
            _, timing = await submit(x[i % len(x)][None])
            latencies.append(time.perf_counter() - started)
            batches.append(timing.batch_rows)

    started = time.perf_counter()
    await asyncio.gather(*(worker(requests // in_flight) for _ in range(in_flight)))
    wall = time.perf_counter() - started
    ms = np.array(latencies) * 1e3
    return {
        "requests": len(latencies),
        "rows_per_s": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_batch": float(np.mean(batches)),
    }


async def in_process(x: np.ndarray, requests: int, in_flight: int) -> dict:
    from service.serving.batching import DynamicBatcher
    from service.serving.runtime import create_runtime
    from service.settings import BatchingConfig, Settings

    runtime = create_runtime(MODEL / "model.onnx", Settings(), 1)
    batcher = DynamicBatcher([runtime.run], BatchingConfig(instances=1), "light:1")
    batcher.start()
    await drive(batcher.submit, x, min(requests, 500), in_flight)  # warm-up
    cpu = time.process_time()
    row = await drive(batcher.submit, x, requests, in_flight)
    front = (time.process_time() - cpu) / row["requests"] * 1e6
    await batcher.stop()
    return row | {"path": "in-process", "cpu_us_front": front, "cpu_us_engine": 0.0, "cpu_us_total": front}


async def through_engine(argv: list[str], endpoint: str, model: str, x, requests: int, in_flight: int) -> dict:
    from service.engine.client import EngineClient

    engine = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = EngineClient(endpoint)
    try:
        await client.start(wait=120)

        def submit(rows):
            return client.submit(model, "1", rows)

        await drive(submit, x, min(requests, 500), in_flight)
        cpu, engine_cpu = time.process_time(), process_cpu_seconds(engine.pid)
        row = await drive(submit, x, requests, in_flight)
        front = (time.process_time() - cpu) / row["requests"] * 1e6
        back = (process_cpu_seconds(engine.pid) - engine_cpu) / row["requests"] * 1e6
    finally:
        await client.stop()
        engine.terminate()
        engine.wait(30)
    return row | {"path": "engine", "cpu_us_front": front, "cpu_us_engine": back, "cpu_us_total": front + back}


def run(requests: int, seconds: float) -> dict:
    from training.data import load_dataset

    x = load_dataset("digits").test.x
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts" / "digits-lenet5"
        artifacts.mkdir(parents=True)
        (artifacts / "1").symlink_to(MODEL)
        (Path(tmp) / "null.py").write_text(NULL_ENGINE)
        for in_flight in (1, IN_FLIGHT):
            rows.append(asyncio.run(in_process(x, requests, in_flight)) | {"model": "light", "in_flight": in_flight})
            endpoint = f"ipc://{tmp}/light.sock"
            argv = [
                sys.executable,
                "-m",
                "service.engine",
                "--endpoint",
                endpoint,
                "--artifacts",
                str(artifacts.parent),
            ]
            got = asyncio.run(through_engine(argv, endpoint, "digits-lenet5", x, requests, in_flight))
            rows.append(got | {"model": "light", "in_flight": in_flight})
            endpoint = f"ipc://{tmp}/null.sock"
            got = asyncio.run(
                through_engine([sys.executable, f"{tmp}/null.py", endpoint], endpoint, "null", x, requests, in_flight)
            )
            rows.append(got | {"model": "null", "in_flight": in_flight})
            print(table(rows[-3:], COLUMNS), flush=True)
    return {"rows": rows, "requests": requests, "service": service_runs(seconds), "seconds_per_run": seconds}


def goals(result: dict) -> list[dict]:
    """Reported figures of the IPC: the issue's goal (W = 2 front-ends at most 1.2x the CPU per request of W = 1,
    the whole service summed over its processes) is judged once the front-ends exist."""
    by = {(r["path"], r["model"], r["in_flight"]): r for r in result["rows"]}
    out = []
    for in_flight in (1, IN_FLIGHT):
        base, engine = by[("in-process", "light", in_flight)], by[("engine", "light", in_flight)]
        added = engine["cpu_us_total"] - base["cpu_us_total"]
        out.append(
            {
                "goal": f"CPU the IPC adds per request, light model, {in_flight} in flight (reported)",
                "met": "reported",
                "worst": f"{added:.0f} us ({engine['cpu_us_front']:.0f} front-end + {engine['cpu_us_engine']:.0f} "
                f"engine, against {base['cpu_us_total']:.0f} in process); batch {engine['mean_batch']:.1f} against "
                f"{base['mean_batch']:.1f}",
            }
        )
    if result.get("service"):
        w1, w2 = (next(r for r in result["service"] if r["frontends"] == w and r["protocol"] == "json") for w in (1, 2))
        ratio = w2["cpu_us_per_request"] / w1["cpu_us_per_request"]
        out.append(
            {
                "goal": f"a pod of 2 front-ends and an engine spends at most {CPU_RATIO}x the CPU per request of one "
                f"process (JSON /predict, single rows, {IN_FLIGHT} connections; summed over the pod's processes)",
                "met": ratio <= CPU_RATIO,
                "worst": f"{ratio:.2f}x ({w2['cpu_us_per_request']:.0f} against {w1['cpu_us_per_request']:.0f} us); "
                f"requests/s {w2['requests_per_s']:.0f} against {w1['requests_per_s']:.0f} on these "
                f"{os.cpu_count()} cores shared with the load generator; 16 cores at this CPU per request, if one "
                f"engine keeps up: {16e6 / w2['cpu_us_per_request']:.0f} requests/s",
            }
        )
    grpc = [r for r in result.get("service", []) if r["protocol"] == "grpc"]
    if grpc:
        out.append(
            {
                "goal": "gRPC ModelInfer, single rows, 64 in flight: requests/s and the mean batch formed, by "
                "front-ends and HTTP/2 connections (reported)",
                "met": "reported",
                "worst": "; ".join(
                    f"W = {r['frontends']}, {r['connections']} connection{'s' * (r['connections'] > 1)}: "
                    f"{r['requests_per_s']:.0f} requests/s, batch {r['mean_batch']:.1f}"
                    for r in grpc
                ),
            }
        )
    null = by[("engine", "null", 1)]
    out.append(
        {
            "goal": "IPC round trip, null model, one request at a time (reported)",
            "met": "reported",
            "worst": f"p50 {null['p50_ms'] * 1e3:.0f} us, p99 {null['p99_ms'] * 1e3:.0f} us",
        }
    )
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    return "\n".join(
        [
            "# Engine benchmark",
            "",
            measured_by("make bench-engine", m, result.get("wall_seconds"))
            + f" {result['requests']} single-row requests a row. "
            "What the first part of the engine design (issue 54) costs: the same requests through the in-process "
            "dynamic batcher and through an engine process over ZeroMQ (`service.engine`); `null` is an engine "
            "whose model answers zeros at once, the IPC alone. The load generator shares the cores with the "
            "engine, so throughput here does not show the scaling that front-end processes buy on a many-core "
            "host; the CPU per request does show what the IPC adds.",
            "",
            "## Goals",
            "",
            table(result["goals"], ["goal", "met", "worst"]),
            "",
            "## Runs",
            "",
            "`cpu_us_front`: this process's CPU per request (the client, or the in-process batcher and its inference "
            "thread); `cpu_us_engine`: the engine process's, from /proc.",
            "",
            table(result["rows"], COLUMNS),
            "",
            "## The service",
            "",
            f"`python -m service` with `CALIB_FRONTENDS` 1 (inference in process) and 2 (a pod: two front-ends and an "
            f"engine on one port), {result.get('seconds_per_run', 0):g} s of wrk at {IN_FLIGHT} connections each, "
            "single-row JSON `/predict` to the light model; the CPU of every process of the service.",
            "",
            table(result.get("service", []), SERVICE_COLUMNS),
            "",
        ]
    )


def arguments(parser) -> None:
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk seconds per service run")


def measure(args) -> dict:
    return run(*((256, 1.0) if args.smoke else (args.requests, args.seconds)))


BENCHMARK = Benchmark(measure, goals, markdown, arguments)
