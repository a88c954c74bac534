"""The engine's IPC cost (``python -m bench.engine``, docs/engine_benchmark.md).

The same single-row requests to the committed light model go through the in-process dynamic batcher (today's
path, W = 1) and through an engine process over ZeroMQ (``service.engine``), one at a time and 64 in flight. A
``null`` model (no inference: zeros back at once) isolates the IPC itself. Reported: the round trip p50 and p99,
and the CPU per request of each process (this front-end process; the engine's from /proc), summed.

    python -m bench.engine [--requests 4000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT, publish, table

PAGE = ROOT / "docs" / "engine_benchmark.md"
MODEL = ROOT / "artifacts" / "digits-lenet5" / "1"
IN_FLIGHT = 64
COLUMNS = [
    "path",
    "model",
    "in_flight",
    "requests",
    "rows_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_us_front",
    "cpu_us_engine",
    "cpu_us_total",
    "mean_batch",
]

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


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        cpu, engine_cpu = time.process_time(), cpu_seconds(engine.pid)
        row = await drive(submit, x, requests, in_flight)
        front = (time.process_time() - cpu) / row["requests"] * 1e6
        back = (cpu_seconds(engine.pid) - engine_cpu) / row["requests"] * 1e6
    finally:
        await client.stop()
        engine.terminate()
        engine.wait(30)
    return row | {"path": "engine", "cpu_us_front": front, "cpu_us_engine": back, "cpu_us_total": front + back}


def run(requests: int) -> dict:
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
    return {"rows": rows, "requests": requests}


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
            f'Measured by `python -m bench.engine` on {m.get("cores")} cores of "{m.get("cpu")}", Python '
            f"{m.get('python')}, at commit `{m.get('commit')}`, {result['requests']} single-row requests a row. "
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
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    requests = 256 if args.smoke else args.requests
    publish("engine", lambda: run(requests), goals, markdown, PAGE, args.smoke)


if __name__ == "__main__":
    main()
