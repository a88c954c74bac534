"""Where the heavy model's time went on CUDA (issue 39, decision 0020): its rows/s under each of the service's
CUDA settings, the batcher alone without HTTP, onnxruntime beside a busy Python thread, and the service's stacks
under py-spy. Kept to rerun on a GPU machine, outside the test suite; its recorded runs are the settings sweeps of
docs/benchmarks.md.

    python -m bench.investigations.gpu_settings --out DIR --artifacts DIR --device cuda [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.common import histogram_means, histogram_totals, table, wrk
from bench.serving.device import CLIENTS, SWEEP_COLUMNS, inputs
from bench.serving.measure import (
    GPU_MAX_BATCH,
    HEAVY,
    SHAPES,
    binary_load,
    raw_onnxruntime,
    service,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device


SWEEP = {
    "defaults": {},
    "one session": {"CALIB_BATCHING__INSTANCES": "1"},
    "no padding": {"CALIB_RUNTIME__PAD_BATCHES": "off"},
    "one session for all buckets": {"CALIB_RUNTIME__BUCKET_SESSIONS": "off"},
    "one intra-op thread": {"CALIB_RUNTIME__INTRA_OP_THREADS": "1"},
}
"""Service settings compared by ``--sweep`` on the heavy model alone, each run twice: in this order, then in the
reverse one, so that a setting's effect can be told from drift over the sweep."""


def sweep_point(artifacts: Path, device: str, seconds: float, work: Path, name: str, env: dict, **launch) -> dict:
    """The heavy model's rows/s and stage means at CLIENTS binary single-row clients under one setting."""
    route, payload, lua = single_row_requests(binary_load(work, HEAVY), HEAVY)["binary"]
    ready = time.monotonic()
    db = f"sqlite:///{work / f'{time.monotonic_ns()}.db'}"
    svc = service(artifacts, db, False, device, CALIB_DEFAULT_MODEL=HEAVY, **env, **launch)
    try:
        row = {"setting": name, "ready_seconds": time.monotonic() - ready}
        wrk(svc.url + route, payload, CLIENTS, 1.0, lua=lua)
        before = histogram_totals(svc.url)
        row["rows_per_s"] = wrk(svc.url + route, payload, CLIENTS, seconds, lua=lua)["requests_per_s"]
        means = histogram_means(
            before, histogram_totals(svc.url), [f"batch:{HEAVY}", f"queue:{HEAVY}", f"inference:{HEAVY}"]
        )
    finally:
        if launch.get("launcher"):
            svc.interrupt()
        else:
            svc.stop()
    return row | {
        "batch": means[f"batch:{HEAVY}"],
        "queue_ms": 1000 * (means[f"queue:{HEAVY}"] or 0),
        "inference_ms": 1000 * (means[f"inference:{HEAVY}"] or 0),
    }


def batcher_alone(artifacts: Path, device: Device, seconds: float, instances: int = 0, model_name: str = HEAVY) -> dict:
    """The service's own model loading, sessions and dynamic batcher, without HTTP: CLIENTS asyncio tasks in this
    process, each submitting one row at a time. Its rows/s, mean batch and mean onnxruntime call per batch, set
    against the service's, tell whether the gap lies in the batcher and sessions or in HTTP and the event loop."""
    import asyncio

    from service.serving.batching import DynamicBatcher
    from service.serving.repository import load_version
    from service.settings import BatchingConfig, Settings

    batching = BatchingConfig(max_batch_size=GPU_MAX_BATCH if device == "cuda" else 64, instances=instances)
    model = load_version(artifacts / model_name / "1", Settings(device=device, batching=batching), batching)
    calls: list[tuple[int, float]] = []

    def timed(runtime):
        def run(x: np.ndarray) -> dict:
            started = time.perf_counter()
            out = runtime.run(x)
            calls.append((len(x), time.perf_counter() - started))
            return out

        return run

    async def load(batcher: DynamicBatcher, x: np.ndarray, until: float) -> int:
        async def client() -> int:
            n = 0
            while time.perf_counter() < until:
                await batcher.submit(x)
                n += 1
            return n

        return sum(await asyncio.gather(*(client() for _ in range(CLIENTS))))

    async def measure() -> dict:
        batcher = DynamicBatcher([timed(r) for r in model.runtimes], batching, model_name)
        batcher.start()
        x = inputs(model_name, 1)
        await load(batcher, x, time.perf_counter() + 1.0)
        calls.clear()
        started = time.perf_counter()
        rows = await load(batcher, x, started + seconds)
        elapsed = time.perf_counter() - started
        await batcher.stop()
        return {
            "model": model_name,
            "sessions": len(model.runtimes),
            "provider": model.runtimes[0].provider,
            "rows_per_s": rows / elapsed,
            "batch": float(np.mean([n for n, _ in calls])),
            "onnxruntime_ms": 1000 * float(np.mean([t for _, t in calls])),
        }

    return asyncio.run(measure())


def settings_sweep(out: Path, device: Device, artifacts: Path, seconds: float, py_spy: str | None = None) -> dict:
    """Where the heavy model's time goes in the service: its rows/s and stage means at CLIENTS binary clients
    under each of SWEEP's settings (twice, ``sweep_point``), the same load on the batcher alone
    (``batcher_alone``), onnxruntime alone at batch 32 in this process with and without a pure-Python thread
    holding the GIL between switch intervals (as the event loop does under load), and, given ``py_spy``, the
    service's native stacks under the defaults (py-spy's raw format, every thread, idle ones included)."""
    import sys
    import threading

    work = Path(tempfile.mkdtemp(prefix="calib-gpu-"))
    heavy_only = work / "artifacts"
    shutil.copytree(artifacts / HEAVY, heavy_only / HEAVY)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"settings": [], "batcher_alone": [], "gil": [], "py_spy": None}
    try:
        for round_, names in enumerate((list(SWEEP), list(reversed(SWEEP))), start=1):
            for name in names:
                row = {"round": round_} | sweep_point(heavy_only, device, seconds, work, name, SWEEP[name])
                result["settings"].append(row)
                print(row, flush=True)
        for instances in (0, 1):
            row = batcher_alone(artifacts, device, seconds, instances)
            result["batcher_alone"].append(row)
            print(row, flush=True)
        if py_spy:
            stacks = out / "py-spy.txt"
            launcher = [py_spy, "record", "--native", "--idle", "--threads", "--rate", "100", "--format", "raw"]
            try:
                row = sweep_point(
                    heavy_only,
                    device,
                    seconds,
                    work,
                    "defaults, under py-spy",
                    {},
                    launcher=[*launcher, "-o", str(stacks), "--"],
                )
                result["py_spy"] = row | {"stacks": stacks.name, "samples": raw_samples(stacks)}
            except Exception as exc:  # noqa: BLE001 - the sweep's figures stand without the profile
                result["py_spy"] = {"error": repr(exc)}
            print(result["py_spy"], flush=True)
        path = artifacts / HEAVY / "1" / "model.onnx"
        for busy, interval in ((False, 0.005), (True, 0.005), (True, 0.0005)):
            stop = threading.Event()

            def spin(stop: threading.Event = stop) -> None:
                n = 0
                while not stop.is_set():
                    n += 1

            sys.setswitchinterval(interval)
            thread = threading.Thread(target=spin, daemon=True)
            if busy:
                thread.start()
            try:
                raw = raw_onnxruntime(path, SHAPES[HEAVY], seconds / 2, (32,), device)[0]
            finally:
                stop.set()
                sys.setswitchinterval(0.005)
            result["gil"].append({"python_thread_busy": busy, "switch_interval_ms": 1000 * interval} | raw)
            print(result["gil"][-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        (out / "sweep.json").write_text(json.dumps(result, indent=2))
    print(table(result["settings"], SWEEP_COLUMNS))
    print(table(result["batcher_alone"], ["sessions", "provider", "rows_per_s", "batch", "onnxruntime_ms"]))
    print(
        table(
            result["gil"],
            ["python_thread_busy", "switch_interval_ms", "batch", "sessions", "rows_per_s", "ms_per_call"],
        )
    )
    return result


def raw_samples(path: Path) -> int:
    """The samples in a py-spy raw (collapsed-stack) file: each line ends in its count."""
    if not path.is_file():
        return 0
    return sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--artifacts", type=Path, required=True, help="the repository of python -m bench.gpu --prepare")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cuda")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--py-spy", help="the py-spy binary that records the service's stacks")
    args = parser.parse_args()
    settings_sweep(args.out, args.device, args.artifacts, args.seconds, args.py_spy)


if __name__ == "__main__":
    main()
