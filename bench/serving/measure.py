"""The serving benchmark's measurements (the package's docstring lists them), for ``goals`` and ``render``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from bench.common import (
    HEAVY,
    LIGHT,
    PG_ADMIN_URL,
    PYTHON,
    Server,
    ab_rounds,
    children_cpu_seconds,
    histogram_means,
    histogram_totals,
    metric_samples,
    process_cpu_seconds,
    service,
    table,
    warm,
    wrk,
)
from bench.serving import monitoring
from bench.serving.harness import (
    BATCH_SIZES,
    PHASES,
    SHAPES,
    baseline_server,
    body,
    both_artifacts,
    drained,
    drained_queue,
    floor_server,
    formed_batch,
    grpc_target,
    raw_at,
    raw_onnxruntime,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device

QUEUE_DELAY_MS = 5.0
PROCESSES = 2  # server processes per prediction-logging setting
RAW_COLUMNS = "batch sessions provider rows_per_s ms_per_call".split()


def batching_floor(
    stats: Callable[[], dict], load: Callable[[], dict], seconds: float, model_path: Path, device: Device
) -> dict:
    """A batching floor's rows/s under ``load`` over onnxruntime alone at the batch size it formed (from ``stats``)."""
    before = stats()
    rps = load()["requests_per_s"]
    after = stats()
    formed = (after["rows"] - before["rows"]) / max(1, after["calls"] - before["calls"])
    return {
        "batching_floor_batch": formed,
        "batching_floor_vs_raw": rps / raw_at(model_path, formed, seconds, device)["rows_per_s"],
    }


def ceiling(
    url: str, pid: int, payload: str | None, clients: int, seconds: float, lua: str | None, raw_rows_per_s: float
) -> dict:
    """The most any server on this HTTP stack can reach against onnxruntime alone, for one protocol. onnxruntime
    alone keeps every core busy, so it spends t = cores / (its rows/s) CPU seconds a row; a server of single-row
    requests also spends at least the floor app's CPU f per request and the client w, so it serves at most cores / (t
    + f + w) rows/s: a ratio of at most t / (t + f + w), f and w measured at ``clients`` clients."""
    cpu, client = process_cpu_seconds(pid), children_cpu_seconds()
    requests = wrk(url, payload, clients, seconds, lua=lua)["requests"]
    f = (process_cpu_seconds(pid) - cpu) / requests
    w = (children_cpu_seconds() - client) / requests
    t = (os.cpu_count() or 1) / raw_rows_per_s
    return {"floor_ms": 1000 * f, "client_ms": 1000 * w, "ceiling": t / (t + f + w)}


def grpc_load(target: str, model: str, clients: int, seconds: float) -> dict:
    """Closed-loop single-row gRPC ModelInfer load on ``target`` (``grpc_load``: h2load, as wrk is for REST)."""
    from bench.serving.grpc_load import load

    return load(target, model, SHAPES[model], clients, seconds)


def grpc_errors(svc: Server) -> float:
    """gRPC calls the service has ended with another status than OK (its ``calib_grpc_requests_total``)."""
    return sum(s.value for s in metric_samples(svc.url, "calib_grpc_requests_total") if s.labels["code"] != "OK")


def _grpc_floor_stats(port: int, timeout: float = 10.0) -> dict:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return json.loads(channel.unary_unary("/floor.Floor/Stats")(b"", timeout=timeout))


def _grpc_floor_up(port: int) -> bool:
    import grpc

    try:
        _grpc_floor_stats(port, timeout=1.0)
    except grpc.RpcError:
        return False
    return True


def grpc_floor_server(model_path: Path) -> Server:
    """The batching floor over gRPC (bench/serving/grpc_floor_app.py) serving ``model_path``."""
    return Server(
        [PYTHON, "-m", "bench.serving.grpc_floor_app"], None, {"FLOOR_MODEL": str(model_path)}, probe=_grpc_floor_up
    )


def check_with_tritonclient(svc: Server, model: str, shape: tuple) -> None:
    """One binary inference through tritonclient.http itself: the probabilities of every row sum to one."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(svc.url.removeprefix("http://"))
    tensor = triton.InferInput("input", [2, *shape], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(2).random((2, *shape), dtype=np.float32), binary_data=True)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("probabilities", binary_data=True)])
    np.testing.assert_allclose(result.as_numpy("probabilities").sum(axis=1), 1.0, atol=1e-4)
    client.close()


def rest_points(server: str, url: str, model: str, concurrency, request_rows, seconds, svc: Server | None = None):
    """``model``'s ``/predict`` load points per request size and concurrency, with the batch ``svc`` formed at each."""
    points = []
    for rows in request_rows:
        payload = body(model if svc else None, SHAPES[model], rows)
        for c in concurrency:
            before = histogram_totals(svc.url) if svc else {}
            point = wrk(f"{url}/predict", payload, c, seconds, warmed=c == concurrency[0])
            formed = {"mean_batch_rows": formed_batch(svc, before, model)} if svc else {}
            points.append(
                {"server": server, "model": model, "rows": rows, "clients": c}
                | formed
                | point
                | {"rows_per_s": point["requests_per_s"] * rows}
            )
    return points


def sweep(svc: Server, concurrency, request_rows, seconds: float, result: dict) -> None:
    """The service's load points, its time split per model and the batch size it formed at each point."""
    for model in SHAPES:
        start = histogram_totals(svc.url)
        result["load"] += rest_points("service", svc.url, model, concurrency, request_rows, seconds, svc)
        drained_queue(svc)  # the last REST point's queued rows must not be counted against gRPC
        warm(grpc_load, grpc_target(svc), model, concurrency[0], 1.0)
        for c in concurrency:  # the same single-row load over gRPC
            before, errors = histogram_totals(svc.url), grpc_errors(svc)
            point = grpc_load(grpc_target(svc), model, c, seconds)
            result["load"].append(
                {
                    "server": "service (gRPC)",
                    "model": model,
                    "rows": 1,
                    "clients": c,
                    "mean_batch_rows": formed_batch(svc, before, model),
                    "rows_per_s": point["requests_per_s"],
                    "non_2xx": point["failed"] + grpc_errors(svc) - errors,
                    **{k: point[k] for k in ("requests_per_s", "p50_ms", "p99_ms")},
                }
            )
        means = histogram_means(start, histogram_totals(svc.url), [*PHASES, f"queue:{model}", f"inference:{model}"])
        result["split"][model] = {k.split(":")[0]: None if v is None else 1000 * v for k, v in means.items()}


def heavy_rounds(
    svc: Server, artifacts: Path, clients: int, seconds: float, rounds: int, device: Device, work: Path
) -> dict:
    """The heavy model's goals in alternating rounds (``ab_rounds``), the others idle meanwhile: the service through
    JSON /predict, v2 binary tensors and gRPC, onnxruntime alone at the batch it formed, the ceiling and the batching
    floor per protocol, and the no-batching baseline. Per ratio, the median round."""
    model_path = artifacts / HEAVY / "1" / "model.onnx"
    requests, baseline_payload = single_row_requests(work), body(None, SHAPES[HEAVY], 1)
    check_with_tritonclient(svc, HEAVY, SHAPES[HEAVY])
    measured = []
    baseline, floor, batching = baseline_server(model_path, device), floor_server(), floor_server(model_path)
    grpc_floor, target = grpc_floor_server(model_path), grpc_target(svc)
    try:
        warm(grpc_load, target, HEAVY, clients, 1.0)
        warm(grpc_load, f"127.0.0.1:{grpc_floor.port}", HEAVY, clients, 1.0)
        for path, side_payload, side_lua in requests.values():
            warm(wrk, svc.url + path, side_payload, clients, 1.0, lua=side_lua)
            warm(wrk, batching.url + path, side_payload, clients, 1.0, lua=side_lua)
        warm(wrk, f"{baseline.url}/predict", baseline_payload, clients, 1.0)
        warm(wrk, f"{floor.url}/predict", requests["json"][1], clients, 1.0)

        def floor_stats(side: str) -> dict:
            return _grpc_floor_stats(grpc_floor.port) if side == "grpc" else batching.get("").json()

        def measure_side(side: str, _round: int) -> dict:
            if side == "baseline":
                rps = wrk(f"{baseline.url}/predict", baseline_payload, clients, seconds)["requests_per_s"]
                return {"baseline_rows_per_s": rps}
            row: dict[str, Any] = {}
            before = histogram_totals(svc.url)
            if side == "grpc":
                errors = grpc_errors(svc)
                point = grpc_load(target, HEAVY, clients, seconds)
                row["grpc_failed"] = point["failed"] + grpc_errors(svc) - errors
                floor_load = partial(grpc_load, f"127.0.0.1:{grpc_floor.port}", HEAVY, clients, seconds)
            else:
                path, payload, script = requests[side]
                point = wrk(svc.url + path, payload, clients, seconds, lua=script)
                floor_load = partial(wrk, batching.url + path, payload, clients, seconds, lua=script)
            formed = formed_batch(svc, before, HEAVY) or 1.0
            raw, rps = raw_at(model_path, formed, seconds, device)["rows_per_s"], point["requests_per_s"]
            row |= {f"{side}_rows_per_s": rps, f"{side}_batch": formed, f"raw_{side}_rows_per_s": raw}
            row[f"{side}_vs_raw"] = rps / raw
            measured_floor = (
                {}
                if side == "grpc"
                else ceiling(floor.url + path, floor.process.pid, payload, clients, seconds, script, raw)
            )
            measured_floor |= batching_floor(partial(floor_stats, side), floor_load, seconds, model_path, device)
            return row | {f"{side}_{key}": value for key, value in measured_floor.items()}

        for sides in ab_rounds(("json", "binary", "grpc", "baseline"), rounds, measure_side):
            row = {key: value for side in sides.values() for key, value in side.items()}
            measured.append(row | {"json_vs_baseline": row["json_rows_per_s"] / row["baseline_rows_per_s"]})
    finally:
        for server in (baseline, floor, batching, grpc_floor):
            server.stop()
    return {"clients": clients, "rounds": measured} | {
        key: sorted(measured, key=lambda r: r[key])[len(measured) // 2]
        for key in ("json_vs_raw", "binary_vs_raw", "grpc_vs_raw", "json_vs_baseline")
    }


def logging_cpu(
    artifacts: Path, work: Path, clients: int, seconds: float, rounds: int, payloads: dict, smoke: bool, device: str
) -> list[dict]:
    """CPU seconds of the server process per 10,000 single-row /predict requests, logging off, to SQLite and to
    PostgreSQL, in ``PROCESSES`` processes each, alternating rounds: far steadier than the requests/s of two
    identical processes, which differ by more than the cost. Read after the log has written every row, so the writes
    count; PostgreSQL's own CPU is not the serving host's."""
    stores = {"off": False, "sqlite": True} | ({} if smoke else {"postgresql": True})
    processes = 1 if smoke else PROCESSES
    servers = {}
    samples: dict[tuple, list[float]] = {}
    try:
        for store, log in stores.items():
            for i in range(processes):
                url = PG_ADMIN_URL if store == "postgresql" else f"sqlite:///{work / f'{store}-{i}.db'}"
                servers[(store, i)] = service(artifacts, url, log, device)
        for model in SHAPES:

            def cpu_per_10k(server: tuple, _round: int, model: str = model) -> float:
                svc, cpu = servers[server], process_cpu_seconds(servers[server].process.pid)
                requests = wrk(f"{svc.url}/predict", payloads[model], clients, seconds)["requests"]
                drained(svc)
                return 10_000 * (process_cpu_seconds(svc.process.pid) - cpu) / requests

            def warm_up(server: tuple, model: str = model) -> None:
                wrk(f"{servers[server].url}/predict", payloads[model], clients, 1.0)
                drained(servers[server])

            for runs in ab_rounds(list(servers), rounds, cpu_per_10k, warm_up):
                for (store, _i), cpu in runs.items():
                    samples.setdefault((store, model), []).append(cpu)
    finally:
        for svc in servers.values():
            svc.stop()
    return [
        {"logging": store, "model": model, "clients": clients, "processes": processes, "rounds": rounds}
        | cpu_summary(samples[(store, model)], samples[("off", model)])
        for model in SHAPES
        for store in stores
    ]


def cpu_summary(samples: list[float], off: list[float]) -> dict:
    """CPU seconds per 10,000 requests (mean, sd, range) and the extra CPU over the same model without logging: the
    ratio of the means minus one, and its range over the ratios within a round and process slot."""
    ratios = [a / b - 1 for a, b in zip(samples, off)]
    return {
        "cpu_s_per_10k": float(np.mean(samples)),
        "sd": float(np.std(samples, ddof=1)) if len(samples) > 1 else 0.0,
        "min": float(np.min(samples)),
        "max": float(np.max(samples)),
        "measurements": len(samples),
        "extra_cpu": float(np.mean(samples) / np.mean(off) - 1),
        "extra_cpu_range": [round(min(ratios), 4), round(max(ratios), 4)],
    }


def mixed_load(svc: Server, payloads: dict, seconds: float, client: httpx.Client) -> None:
    """One round of the soak's mixed load: single-row predictions of both models, 1000 labels, a calibration report."""
    wrk(f"{svc.url}/predict", payloads[LIGHT], 16, max(1.0, seconds * 0.7))
    wrk(f"{svc.url}/predict", payloads[HEAVY], 16, max(1.0, seconds * 0.3))
    client.post("/feedback", json={"items": monitoring.offline_items(1000, seed=3)}).raise_for_status()
    client.get("/calibration", params={"window": "100000"}).raise_for_status()


def soak(svc: Server, minutes: float, warm: dict, started: float, payloads: dict) -> dict:
    """Mixed load until ``minutes`` have passed since ``started``, RSS after each round (``warm``: after warm-up)."""
    samples = [warm]
    deadline = started + 60 * minutes
    with httpx.Client(base_url=svc.url, timeout=120) as client:
        while not samples[1:] or time.monotonic() < deadline:
            mixed_load(svc, payloads, max(1.0, min(20.0, deadline - time.monotonic())), client)
            samples.append({"minutes": (time.monotonic() - started) / 60, "rss_mib": svc.rss_mib()})
    end = samples[-1]["rss_mib"]
    return {
        "warm_rss_mib": warm["rss_mib"],
        "end_rss_mib": end,
        "minutes": samples[-1]["minutes"],
        "growth": end / warm["rss_mib"] - 1,
        "samples": samples,
    }


async def _queue_delays(url: str, payload: str, clients: int, seconds: float) -> list[float]:
    delays: list[float] = []

    async def client_loop(client: httpx.AsyncClient, deadline: float) -> None:
        while time.monotonic() < deadline:
            r = await client.post("/predict", content=payload, headers={"content-type": "application/json"})
            r.raise_for_status()
            timing = dict(part.strip().split(";dur=") for part in r.headers["server-timing"].split(","))
            delays.append(float(timing["queue"]))

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(client_loop(client, time.monotonic() + seconds) for _ in range(clients)))
    return delays


def queue_delay_check(artifacts: Path, database_url: str, seconds: float, device: str) -> dict:
    """Queue time per request (Server-Timing) at QUEUE_DELAY_MS, 4 light clients: a machine mostly idle."""
    with service(artifacts, database_url, False, device, CALIB_BATCHING__MAX_QUEUE_DELAY_MS=str(QUEUE_DELAY_MS)) as svc:
        warm(lambda: asyncio.run(_queue_delays(svc.url, body(LIGHT, SHAPES[LIGHT], 1), 4, 1.0)))
        delays = asyncio.run(_queue_delays(svc.url, body(LIGHT, SHAPES[LIGHT], 1), 4, seconds))
    return {
        "max_queue_delay_ms": QUEUE_DELAY_MS,
        "clients": 4,
        "requests": len(delays),
        "p50_ms": float(np.percentile(delays, 50)),
        "p99_ms": float(np.percentile(delays, 99)),
        "max_ms": float(np.max(delays)),
    }


def run(
    seconds: float,
    concurrency: tuple[int, ...],
    request_rows: tuple[int, ...],
    stored_rows: int,
    soak_minutes: float,
    smoke: bool,
    device: Device,
) -> dict:
    """Both models on ``device`` (the light one, where HTTP dominates; the heavy one, where inference does):
    onnxruntime alone, then one soak server for the load points, the heavy rounds, monitoring and the soak, then the
    baseline, the log's CPU and the queue delay."""
    top = concurrency[-1]
    work = Path(tempfile.mkdtemp(prefix="calib-bench-"))
    artifacts = both_artifacts(work)
    result: dict[str, Any] = {"seconds_per_point": seconds, "raw": {}, "load": [], "logging": [], "split": {}}
    payloads = {model: body(model, shape, 1) for model, shape in SHAPES.items()}
    try:
        for model, shape in SHAPES.items():
            onnx = artifacts / model / "1" / "model.onnx"
            batches = BATCH_SIZES[:2] if smoke else BATCH_SIZES  # a smoke run checks the path, not the curve
            result["raw"][model] = raw_onnxruntime(onnx, shape, 0.3 if smoke else 1.5, batches, device)
            print(f"\nonnxruntime alone, {model}\n" + table(result["raw"][model], RAW_COLUMNS))

        sqlite_url = f"sqlite:///{work / 'bench.db'}"
        fill_seconds = monitoring.fill_store(sqlite_url, stored_rows)
        with service(artifacts, sqlite_url, True, device) as svc:
            result["providers"] = {m["name"]: m["provider"] for m in svc.get("/health").json()["models"]}
            load_started = time.monotonic()
            # warm-up: every request shape of the sweep and of the heavy rounds (binary v2 too) at its top
            # concurrency, every report window and feedback batches, then one round of the soak's steady
            # load, so the reference RSS is taken in that steady regime, not at the transient peak of the
            # largest requests (also recorded)
            for model, shape in SHAPES.items():
                for rows in request_rows:
                    warm(wrk, f"{svc.url}/predict", body(model, shape, rows), top, 3.0)
            path, payload, script = single_row_requests(work)["binary"]
            warm(wrk, svc.url + path, payload, top, 3.0, lua=script)
            shapes_rss = svc.rss_mib()
            windows = [w for w in (1_000, 100_000, 1_000_000) if w <= stored_rows]
            with httpx.Client(base_url=svc.url, timeout=120) as client:
                for window in windows:
                    client.get("/calibration", params={"window": str(window)}).raise_for_status()
                warm(monitoring.feedback_throughput, svc.url, 3.0, 1000)
                warm(mixed_load, svc, payloads, 20.0, client)
            steady = {"minutes": (time.monotonic() - load_started) / 60, "rss_mib": svc.rss_mib()}
            sweep(svc, concurrency, request_rows, seconds, result)
            result["heavy_rounds"] = heavy_rounds(svc, artifacts, top, seconds, 1 if smoke else 3, device, work)
            result["monitoring"] = {
                "rows": stored_rows,
                "fill_seconds": fill_seconds,
                "calibration": monitoring.calibration_latency(svc.url, windows, 5 if smoke else 20),
                "feedback": monitoring.feedback_throughput(svc.url, 2.0 if smoke else 5.0, 1000),
                "server": "the soak server (prediction logging on)",
            }
            result["soak"] = soak(svc, soak_minutes, steady, load_started, payloads) | {
                "after_shapes_rss_mib": shapes_rss
            }
        for model in SHAPES:
            with baseline_server(artifacts / model / "1" / "model.onnx", device) as baseline:
                result["load"] += rest_points("baseline", baseline.url, model, concurrency, request_rows, seconds)
        # 2-second measurements: the six servers are visited in turn three times per model
        result["logging"] = logging_cpu(
            artifacts, work, top, min(seconds, 2.0), 1 if smoke else 3, payloads, smoke, device
        )
        result["queue_delay"] = queue_delay_check(artifacts, sqlite_url, 2.0 if smoke else 6.0, device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def heavy_only(seconds: float, rounds: int, device: Device) -> dict:
    """``heavy_rounds`` alone on a fresh service (prediction logging on, a small SQLite store), after a warm-up."""
    work = Path(tempfile.mkdtemp(prefix="calib-bench-"))
    try:
        artifacts = both_artifacts(work)
        with service(artifacts, f"sqlite:///{work / 'bench.db'}", True, device) as svc:
            for path, payload, script in single_row_requests(work).values():
                wrk(svc.url + path, payload, 64, seconds, lua=script)
            return heavy_rounds(svc, artifacts, 64, seconds, rounds, device, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
