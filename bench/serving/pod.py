"""The pod on a device (issue 54; ``python -m bench.serving --engine``, or ``python -m bench.gpu --engine``, which adds
``--device cuda``): W front-ends feeding one engine, in one command.

For W in ``--frontends`` (1 is today's in-process path), each of the two models (light LeNet-5, heavy ResNet-56),
each protocol (v2 binary tensors, JSON ``/predict``, gRPC ``ModelInfer`` over at least 2W HTTP/2 connections) and
each count of single-row clients (64, 128): requests/s, the batch the engine formed, the CPU per request of the
front-ends and of the engine (from /proc), the engine's inference busy share (its inference histogram over the wall
time) and the GPU's utilisation (NVML); at one client p50, p99 and the mean round trip, queue and inference. Then
the same load on two plain replicas (W = 1 each, a CUDA context each, the clients split between them), onnxruntime
alone at every batch that was formed and at the bucket it is padded to on CUDA (``vs_padded``: rows/s against the
padded call, scaled to the rows used), and the probabilities of every W against the CPU path. Results are written
after every stage, so that a run cut short still returns what it measured: ``engine-gpu.json`` and ``engine-gpu.md``
under ``--out``. Goals: ``bench.serving.goals.pod_goals``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from bench.common import Server, children, histogram_totals, machine, process_cpu_seconds, save_stage, table, wrk
from bench.serving.goals import REPLICAS, pod_goals
from bench.serving.grpc_load import load as grpc_load
from bench.serving.measure import (
    HEAVY,
    LIGHT,
    SHAPES,
    binary_load,
    drained_queue,
    raw_onnxruntime,
    service,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device

MODELS = (HEAVY, LIGHT)
PROTOCOLS = ("binary", "json", "grpc")
CLIENTS = (64, 128)
PARITY_ROWS = 64
POINT_COLUMNS = (
    "frontends model protocol clients requests_per_s batch raw_rows_per_s vs_raw vs_padded cpu_us_frontends "
    "cpu_us_engine cpu_us_engine_loop message_rows round_trip_ms inference_busy gpu_util queue_ms inference_ms errors"
).split()


def grpc_connections(frontends: int) -> int:
    """HTTP/2 connections for gRPC load: the smallest power of two of at least 2W, so that SO_REUSEPORT's hash
    reaches every front-end and the clients divide evenly among the connections."""
    return 1 << (2 * frontends - 1).bit_length()


def padded_to(batch: float) -> int:
    """The bucket a batch of ``batch`` rows (rounded) is padded to on CUDA (``service.serving.runtime``)."""
    from service.serving.runtime import batch_buckets
    from service.settings import Settings

    settings = Settings()
    rows = max(1, round(batch))
    buckets = batch_buckets(settings.batching.max_batch_size, settings.runtime.bucket_step)
    return next((b for b in buckets if b >= rows), rows)


def roles(svc: Server) -> dict[str, list[int]]:
    """The service's processes by role: ``engine`` (``python -m service.engine``) and ``frontends`` (the rest:
    the in-process server itself at W = 1, else the pod's front-ends and its idle supervisor)."""
    root = svc.process.pid
    kids = children(root)
    engine = [c for c in kids if b"service.engine" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return {"engine": engine, "frontends": [root, *(c for c in kids if c not in engine)]}


def role_cpu(servers: list[Server]) -> dict[str, float]:
    """CPU seconds by role, and ``engine_loop``: the engine's main thread (its event loop: receiving, batching and
    answering messages), the rest of the engine being its inference threads and onnxruntime's."""
    out = {"engine": 0.0, "frontends": 0.0, "engine_loop": 0.0}
    for svc in servers:
        for role, pids in roles(svc).items():
            out[role] += sum(process_cpu_seconds(p) for p in pids)
            if role == "engine":
                out["engine_loop"] += sum(process_cpu_seconds(p, thread=p) for p in pids)
    return out


class GpuUtilisation:
    """The GPU's utilisation (NVML's share of time a kernel ran), sampled every 100 ms while a load runs; None
    where NVML is missing (no GPU)."""

    def __init__(self) -> None:
        self._read: Callable[[], float] | None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
        except Exception:  # noqa: BLE001 - no NVML, no GPU: the figure is simply absent
            self._read = None
        self._samples: list[float] = []
        self._stop = threading.Event()

    def __enter__(self) -> GpuUtilisation:
        self._samples, self._stop = [], threading.Event()
        if self._read is not None:
            threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self) -> None:
        assert self._read is not None  # sampled only where NVML answers
        while not self._stop.wait(0.1):
            self._samples.append(self._read())

    def __exit__(self, *exc) -> None:
        self._stop.set()

    @property
    def mean(self) -> float | None:
        return float(np.mean(self._samples)) / 100 if self._samples else None


def drive(servers: list[Server], model: str, protocol: str, clients: int, seconds: float, work: Path, w: int) -> dict:
    """``clients`` closed-loop single-row clients split evenly over ``servers``, all at once; summed requests/s."""
    share = clients // len(servers)

    def one(svc: Server) -> dict:
        if protocol == "grpc":
            target = f"127.0.0.1:{httpx.get(f'{svc.url}/health').json()['grpc_port']}"
            connections = min(share, grpc_connections(w))
            got = grpc_load(target, model, SHAPES[model], share, seconds, connections, threads=4)
            return got | {"errors": got["failed"]}
        route, payload, lua = single_row_requests(binary_load(work, model), model)[protocol]
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


def totals(servers: list[Server], model: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for svc in servers:
        for key, (s, c) in histogram_totals(svc.url).items():
            if key.endswith(f":{model}"):
                out.setdefault(key.split(":")[0], [0.0, 0.0])
                out[key.split(":")[0]][0] += s
                out[key.split(":")[0]][1] += c
    return out


def point(servers: list[Server], model: str, protocol: str, clients: int, seconds: float, work: Path, w: int) -> dict:
    """One load point: requests/s, the formed batch, CPU per request by role, busy shares, stage means."""
    before, cpu = totals(servers, model), role_cpu(servers)
    started = time.perf_counter()
    with GpuUtilisation() as gpu:
        got = drive(servers, model, protocol, clients, seconds, work, w)
    wall = time.perf_counter() - started
    after, used = totals(servers, model), role_cpu(servers)

    def delta(key: str) -> tuple[float, float]:
        (total, count), (total_before, count_before) = after.get(key, [0, 0]), before.get(key, [0, 0])
        return total - total_before, count - count_before

    rows, batches = delta("batch")
    n = max(1, got["requests"])
    return {
        "model": model,
        "protocol": protocol,
        "clients": clients,
        "requests_per_s": got["requests_per_s"],
        "p50_ms": got["p50_ms"],
        "p99_ms": got["p99_ms"],
        "errors": got["errors"],
        "batch": rows / batches if batches else None,
        "cpu_us_frontends": 1e6 * (used["frontends"] - cpu["frontends"]) / n,
        "cpu_us_engine": 1e6 * (used["engine"] - cpu["engine"]) / n,
        "cpu_us_engine_loop": 1e6 * (used["engine_loop"] - cpu["engine_loop"]) / n,
        "message_rows": delta("message")[0] / delta("message")[1] if delta("message")[1] else None,
        "round_trip_ms": 1e3 * delta("round")[0] / delta("round")[1] if delta("round")[1] else None,
        "inference_busy": delta("inference")[0] / wall,
        "gpu_util": gpu.mean,
        "queue_ms": 1e3 * delta("queue")[0] / max(1, delta("queue")[1]),
        "inference_ms": 1e3 * delta("inference")[0] / max(1, delta("inference")[1]),
    }


def served(url: str, model: str) -> np.ndarray:
    from bench.serving.device import inputs, served_probabilities

    return served_probabilities(url, model, inputs(model, PARITY_ROWS))


def sweep_service(servers: list[Server], w: int, seconds: float, work: Path, label: str) -> list[dict]:
    """Every (model, protocol, clients) point on ``servers``, a one-second warm-up per model and protocol; then one
    client, whose stage means (round trip, queue, inference) show where its latency goes."""
    rows = []
    for model in MODELS:
        for protocol in PROTOCOLS:
            drive(servers, model, protocol, CLIENTS[0], 1.0, work, w)  # warm-up: the batch sizes this load forms
            for clients in CLIENTS:
                row = {"frontends": label} | point(servers, model, protocol, clients, seconds, work, w)
                rows.append(row)
                print(table([row], POINT_COLUMNS), flush=True)
            drained_queue(servers[0])  # the loaded point's last requests would count as the one client's
            time.sleep(0.2)
            rows.append({"frontends": label} | point(servers[:1], model, protocol, 1, 1.0, work, w))
    return rows


def run(
    out: Path,
    device: Device,
    artifacts: Path,
    seconds: float,
    frontends: tuple[int, ...],
    deadline: float = 3.2,
    replicas: bool = True,
) -> dict:
    """Every measurement of the module docstring; no further W is started ``deadline`` minutes into the run, so that
    the run ends inside its machine's time with the replicas, onnxruntime alone and parity measured."""
    from bench.serving.device import device_report, single_row_latency

    work = Path(tempfile.mkdtemp(prefix="calib-engine-gpu-"))
    started = time.monotonic()
    result: dict = {"device_asked": device, "seconds_per_point": seconds, "points": [], "parity": []}
    probabilities: dict[str, dict[str, np.ndarray]] = {}  # by W, then model: compared with the CPU path at the end

    def save(stage: str) -> None:
        save_stage(out / "engine-gpu.json", result, stage, started)

    try:
        result["device"] = device_report(device)
        result["single_row"] = {m: single_row_latency(artifacts / m / "1" / "model.onnx", device, 1.0) for m in MODELS}
        save("single-row")
        for w in frontends:
            if time.monotonic() - started > 60 * deadline:
                result.setdefault("skipped", []).append(w)
                continue
            ready = time.monotonic()
            db = f"sqlite:///{work / f'w{w}.db'}"
            svc = service(artifacts, db, True, device, output=work / f"w{w}.log", CALIB_FRONTENDS=str(w))
            result.setdefault("ready_seconds", {})[str(w)] = time.monotonic() - ready
            try:
                result.setdefault("health", {})[str(w)] = httpx.get(f"{svc.url}/health").json().get("pod")
                probabilities[f"W={w}"] = {m: served(svc.url, m) for m in MODELS}
                result["points"] += sweep_service([svc], w, seconds, work, str(w))
            finally:
                svc.stop()
            save(f"W={w}")
        if replicas:
            pair = [
                service(artifacts, f"sqlite:///{work / f'r{i}.db'}", True, device, CALIB_FRONTENDS="1")
                for i in range(2)
            ]
            try:
                result["points"] += sweep_service(pair, 1, seconds, work, REPLICAS)
            finally:
                for svc in pair:
                    svc.stop()
            save("two replicas")
        formed: dict[str, set[int]] = {m: set() for m in MODELS}
        for row in result["points"]:
            if row.get("batch"):
                formed[row["model"]].add(max(1, round(row["batch"])))
                formed[row["model"]].add(padded_to(row["batch"]))
        result["raw"] = {
            m: {
                str(r["batch"]): r["rows_per_s"]
                for r in raw_onnxruntime(
                    artifacts / m / "1" / "model.onnx", SHAPES[m], 0.5, tuple(sorted(formed[m])), device
                )
            }
            for m in MODELS
            if formed[m]
        }
        for row in result["points"]:
            if row.get("batch"):
                raw = result["raw"][row["model"]]
                row["raw_rows_per_s"] = raw[str(max(1, round(row["batch"])))]
                row["vs_raw"] = row["requests_per_s"] / row["raw_rows_per_s"]
                bucket = padded_to(row["batch"])
                row["vs_padded"] = row["requests_per_s"] / (raw[str(bucket)] * row["batch"] / bucket)
        save("onnxruntime alone")
        cpu = service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu", CALIB_FRONTENDS="1")
        try:
            reference = {m: served(cpu.url, m) for m in MODELS}
        finally:
            cpu.stop()
        result["parity"] = [
            {"server": name, "model": m, "max_abs_diff": float(np.abs(p[m] - reference[m]).max())}
            for name, p in probabilities.items()
            for m in MODELS
        ]
        result["goals"] = pod_goals(result)
        save("parity and goals")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        (out / "engine-gpu.md").write_text(report(result))
    return result


def report(result: dict) -> str:
    device = result.get("device", {})
    loaded = [p for p in result["points"] if p["clients"] != 1]
    ones = [p for p in result["points"] if p["clients"] == 1]
    lines = [
        f"## The engine on {device.get('gpu', result['device_asked'])} (`python -m bench.gpu --engine`)",
        f"{json.dumps(device.get('machine', machine()))}; {result.get('minutes', 0):.1f} minutes, "
        f"{result['seconds_per_point']} s per point; ready seconds by W: {json.dumps(result.get('ready_seconds'))}",
        "\n### Single-row clients\n" + table(loaded, POINT_COLUMNS),
        "\n### One client (ms)\n"
        + table(
            ones,
            [
                "frontends",
                "model",
                "protocol",
                "p50_ms",
                "p99_ms",
                "round_trip_ms",
                "queue_ms",
                "inference_ms",
                "errors",
            ],
        ),
        "\n### Raw single-row inference (ms)\n"
        + table([{"model": m} | v for m, v in result.get("single_row", {}).items()], ["model", "provider", "p50_ms"]),
    ]
    if result["parity"]:
        lines.append("\n### Against the CPU path\n" + table(result["parity"], ["server", "model", "max_abs_diff"]))
    if result.get("goals"):
        lines.append("\n### Goals\n" + table(result["goals"], ["goal", "measured", "target", "met", "at"]))
    return "\n".join(lines) + "\n"
