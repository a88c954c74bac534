"""The pod on a device (issue 54, ``python -m bench.gpu --engine``): W front-ends feeding one engine.

For each W of ``--frontends`` (1: in process), both models, each protocol (v2 binary, JSON, gRPC over at least 2W
connections) at 64 and 128 single-row clients: requests/s, the batch formed, the CPU per request of the front-ends
and of the engine, its inference busy share, the GPU's utilisation; at one client, p50, p99 and where the time goes.
Then two plain replicas, onnxruntime alone at every batch formed and its padded bucket (``vs_padded``), and every W's
probabilities against the CPU path's. Goals: ``bench.serving.goals.pod_goals``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.common import (
    Server,
    children,
    histogram_means,
    machine,
    process_cpu_seconds,
    save_stage,
    service,
    table,
    wrk,
)
from bench.gpu.device import MODELS, device_report, served, single_row_latency
from bench.serving.goals import REPLICAS, pod_goals
from bench.serving.grpc_load import load as grpc_load
from bench.serving.harness import SHAPES, grpc_target, raw_onnxruntime, settled_totals, single_row_requests

if TYPE_CHECKING:
    from service.settings import Device

PROTOCOLS = ("binary", "json", "grpc")
POD_CLIENTS = (64, 128)
POD_COLUMNS = (
    "frontends model protocol clients requests_per_s batch raw_rows_per_s vs_raw vs_padded cpu_us_frontends "
    "cpu_us_engine cpu_us_engine_loop message_rows round_trip_ms inference_busy gpu_util queue_ms inference_ms errors"
)


def grpc_connections(frontends: int) -> int:
    """HTTP/2 connections for gRPC load: the smallest power of two of at least 2W, so that SO_REUSEPORT's hash
    reaches every front-end and the clients divide evenly."""
    return 1 << (2 * frontends - 1).bit_length()


def padded_to(batch: float) -> int:
    """The bucket a batch of ``batch`` rows (rounded) is padded to on CUDA (``service.serving.runtime``)."""
    from service.serving.runtime import batch_buckets
    from service.settings import Settings

    settings = Settings()
    rows = max(1, round(batch))
    buckets = batch_buckets(settings.batching.max_batch_size, settings.runtime.bucket_step)
    return next((b for b in buckets if b >= rows), rows)


def role_cpu(servers: list[Server]) -> dict[str, float]:
    """CPU seconds by role: ``engine``, ``frontends`` (the in-process server at W = 1, else the front-ends and the
    idle supervisor) and ``engine_loop``, the engine's event loop thread (the rest is inference)."""
    out = {"frontends": 0.0, "engine": 0.0, "engine_loop": 0.0}
    for svc in servers:
        for pid in [svc.process.pid, *children(svc.process.pid)]:
            if b"service.engine" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out["engine"] += process_cpu_seconds(pid)
                out["engine_loop"] += process_cpu_seconds(pid, thread=pid)
            else:
                out["frontends"] += process_cpu_seconds(pid)
    return out


@contextmanager
def gpu_utilisation() -> Iterator[list[float]]:
    """The GPU's utilisation (NVML), sampled every 100 ms while a load runs; no samples without NVML."""
    samples: list[float] = []
    stop = threading.Event()
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - no NVML, no GPU: the figure is simply absent
        handle = None

    def sample() -> None:
        while not stop.wait(0.1):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    if handle is not None:
        threading.Thread(target=sample, daemon=True).start()
    try:
        yield samples
    finally:
        stop.set()


def drive(servers: list[Server], model: str, protocol: str, clients: int, seconds: float, work: Path, w: int) -> dict:
    """``clients`` closed-loop single-row clients split evenly over ``servers``, all at once; summed requests/s."""
    share = clients // len(servers)

    def one(svc: Server) -> dict:
        if protocol == "grpc":
            connections = min(share, grpc_connections(w))
            got = grpc_load(grpc_target(svc), model, SHAPES[model], share, seconds, connections, threads=4)
            return got | {"errors": got["failed"]}
        route, payload, lua = single_row_requests(work, model)[protocol]
        got = wrk(svc.url + route, payload, share, seconds, lua=lua, threads=min(4, share))
        return got | {"errors": got["non_2xx"]}

    with ThreadPoolExecutor(len(servers)) as pool:
        runs = list(pool.map(one, servers))
    return {
        "requests_per_s": sum(r["requests_per_s"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        "p50_ms": float(np.mean([r["p50_ms"] for r in runs])),
        "p99_ms": float(max(r["p99_ms"] for r in runs)),
        "errors": sum(r["errors"] for r in runs),
    }


def point(servers: list[Server], model: str, protocol: str, clients: int, seconds: float, work: Path, w: int) -> dict:
    """One load point: requests/s, the formed batch, CPU per request by role, busy shares, stage means."""
    before, cpu = settled_totals(servers, model), role_cpu(servers)  # a warm-up's or the last point's in flight
    started = time.perf_counter()
    with gpu_utilisation() as gpu:
        got = drive(servers, model, protocol, clients, seconds, work, w)
    wall = time.perf_counter() - started
    after, used = settled_totals(servers, model), role_cpu(servers)
    means = histogram_means(before, after, ["batch", "message", "round", "queue", "inference"])
    n = max(1, got["requests"])
    return (
        {"model": model, "protocol": protocol, "clients": clients}
        | {k: got[k] for k in ("requests_per_s", "p50_ms", "p99_ms", "errors")}
        | {"batch": means["batch"]}
        | {f"cpu_us_{role}": 1e6 * (used[role] - cpu[role]) / n for role in cpu}
        | {
            "message_rows": means["message"],
            "round_trip_ms": None if means["round"] is None else 1e3 * means["round"],
            "inference_busy": (after.get("inference", [0, 0])[0] - before.get("inference", [0, 0])[0]) / wall,
            "gpu_util": float(np.mean(gpu)) / 100 if gpu else None,
            "queue_ms": 1e3 * (means["queue"] or 0.0),
            "inference_ms": 1e3 * (means["inference"] or 0.0),
        }
    )


def against_cpu(artifacts: Path, work: Path, probabilities: dict[str, dict[str, np.ndarray]], key: str) -> list[dict]:
    """The largest absolute difference of each server's probabilities of every model from the CPU path's."""
    with service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu", CALIB_FRONTENDS="1") as cpu:
        reference = {m: served(cpu.url, m) for m in MODELS}
    return [
        {key: name, "model": m, "max_abs_diff": float(np.abs(p[m] - reference[m]).max())}
        for name, p in probabilities.items()
        for m in MODELS
    ]


def versus_raw(rows: list[dict], path: Path, model: str, device: Device, more: tuple[int, ...] = ()) -> dict[str, dict]:
    """onnxruntime alone at every batch ``rows`` formed, at its padded bucket and at ``more``: each row's
    ``raw_rows_per_s``, ``vs_raw`` and ``vs_padded`` (against the padded call, scaled to the rows used)."""
    rows = [row for row in rows if row.get("batch")]
    formed = {max(1, round(row["batch"])) for row in rows} | {padded_to(row["batch"]) for row in rows} | set(more)
    raw = {str(r["batch"]): r for r in raw_onnxruntime(path, SHAPES[model], 0.5, tuple(sorted(formed)), device)}
    for row in rows:
        bucket = padded_to(row["batch"])
        row["raw_rows_per_s"] = raw[str(max(1, round(row["batch"])))]["rows_per_s"]
        row["vs_raw"] = row["requests_per_s"] / row["raw_rows_per_s"]
        row["vs_padded"] = row["requests_per_s"] / (raw[str(bucket)]["rows_per_s"] * row["batch"] / bucket)
    return raw


def sweep_service(servers: list[Server], w: int, seconds: float, work: Path, label: str) -> list[dict]:
    """Every (model, protocol, clients) point on ``servers``, then one client's stage means: where its latency goes."""
    rows = []
    for model in MODELS:
        for protocol in PROTOCOLS:
            drive(servers, model, protocol, POD_CLIENTS[0], 1.0, work, w)  # warm-up: the batch sizes this load forms
            for clients in POD_CLIENTS:
                rows.append({"frontends": label} | point(servers, model, protocol, clients, seconds, work, w))
                print(table(rows[-1:], POD_COLUMNS), flush=True)
            rows.append({"frontends": label} | point(servers[:1], model, protocol, 1, 1.0, work, w))
    return rows


@contextmanager
def stages(out: Path, name: str, result: dict, report: Callable[[dict], str]) -> Iterator[tuple[Path, Callable]]:
    """A device run's scratch folder and ``save(stage)`` (``save_stage``); the report is written regardless."""
    work = Path(tempfile.mkdtemp(prefix=f"calib-{name}-"))
    try:
        yield work, partial(save_stage, out / f"{name}.json", result, started=time.monotonic())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(report(result))


def run_pod(
    out: Path,
    device: Device,
    artifacts: Path,
    seconds: float,
    frontends: tuple[int, ...],
    deadline: float = 3.2,
    replicas: bool = True,
) -> dict:
    """The pod of the module docstring; no W starts after ``deadline`` minutes, so that the run ends in time."""
    started = time.monotonic()
    result: dict = {"device_asked": device, "seconds_per_point": seconds, "points": [], "parity": []}
    probabilities: dict[str, dict[str, np.ndarray]] = {}  # by W, then model: compared with the CPU path at the end
    with stages(out, "engine-gpu", result, pod_report) as (work, save):
        result["device"] = device_report(device)
        result["single_row"] = {m: single_row_latency(artifacts / m / "1" / "model.onnx", device, 1.0) for m in MODELS}
        save("single-row")
        for w in frontends:
            if time.monotonic() - started > 60 * deadline:
                result.setdefault("skipped", []).append(w)
                continue
            ready = time.monotonic()
            db = f"sqlite:///{work / f'w{w}.db'}"
            with service(artifacts, db, True, device, output=work / f"w{w}.log", CALIB_FRONTENDS=str(w)) as svc:
                result.setdefault("ready_seconds", {})[str(w)] = time.monotonic() - ready
                result.setdefault("health", {})[str(w)] = svc.get("/health").json().get("pod")
                probabilities[f"W={w}"] = {m: served(svc.url, m) for m in MODELS}
                result["points"] += sweep_service([svc], w, seconds, work, str(w))
            save(f"W={w}")
        if replicas:
            with ExitStack() as stack:
                dbs = [f"sqlite:///{work / f'r{i}.db'}" for i in range(2)]
                pair = [stack.enter_context(service(artifacts, db, True, device, CALIB_FRONTENDS="1")) for db in dbs]
                result["points"] += sweep_service(pair, 1, seconds, work, REPLICAS)
            save("two replicas")
        result["raw"] = {}
        for m in MODELS:
            if rows := [row for row in result["points"] if row["model"] == m and row.get("batch")]:
                raw = versus_raw(rows, artifacts / m / "1" / "model.onnx", m, device)
                result["raw"][m] = {batch: r["rows_per_s"] for batch, r in raw.items()}
        save("onnxruntime alone")
        result["parity"] = against_cpu(artifacts, work, probabilities, "server")
        result["goals"] = pod_goals(result)
        save("parity and goals")
    return result


def pod_report(result: dict) -> str:
    device = result.get("device", {})
    loaded = [p for p in result["points"] if p["clients"] != 1]
    ones = [p for p in result["points"] if p["clients"] == 1]
    single = [{"model": m} | v for m, v in result.get("single_row", {}).items()]
    lines = [
        f"## The engine on {device.get('gpu', result['device_asked'])} (`python -m bench.gpu --engine`)",
        f"{json.dumps(device.get('machine', machine()))}; {result.get('minutes', 0):.1f} minutes, "
        f"{result['seconds_per_point']} s per point; ready seconds by W: {json.dumps(result.get('ready_seconds'))}",
        "\n### Single-row clients\n" + table(loaded, POD_COLUMNS),
        "\n### One client (ms)\n"
        + table(ones, "frontends model protocol p50_ms p99_ms round_trip_ms queue_ms inference_ms errors"),
        "\n### Raw single-row inference (ms)\n" + table(single, "model provider p50_ms"),
    ]
    if result["parity"]:
        lines.append("\n### Against the CPU path\n" + table(result["parity"], "server model max_abs_diff"))
    if result.get("goals"):
        lines.append("\n### Goals\n" + table(result["goals"], "goal measured target met at"))
    return "\n".join(lines) + "\n"
