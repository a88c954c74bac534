"""The serving benchmark's measurements: onnxruntime alone, the service, the no-batching baseline and the floor
apps under closed-loop load, the prediction log's CPU cost, the queue delay, monitoring latency and a memory soak.
``goals`` judges what they return and ``render`` prints it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from bench.common import (
    HEAVY,
    LIGHT,
    PYTHON,
    ROOT,
    Server,
    ab_rounds,
    children_cpu_seconds,
    histogram_means,
    histogram_totals,
    metric_samples,
    process_cpu_seconds,
    service,
    table,
    v2_binary_request,
    wrk,
)
from bench.serving import monitoring

if TYPE_CHECKING:
    from service.settings import Device

SHAPES = {LIGHT: (1, 8, 8), HEAVY: (3, 32, 32)}
BATCH_SIZES = (1, 8, 32, 128, 512)
QUEUE_DELAY_MS = 5.0
CUDA = "CUDAExecutionProvider"
PROCESSES = 2  # server processes per prediction-logging setting
PHASES = ["parse", "validate", "batch", "encode", "total"]


def heavy_artifact(root: Path) -> None:
    """The heavy model: an untrained CIFAR ResNet-56 under ``root`` (``training.untrained``)."""
    from training.untrained import untrained_artifact

    untrained_artifact(root, HEAVY)


def raw_onnxruntime(
    path: Path, shape: tuple, seconds: float, batches=BATCH_SIZES, device: Device = "auto"
) -> list[dict]:
    """rows/s of onnxruntime alone with the service's providers, sessions, thread and I/O binding
    settings: each of the model's sessions called back to back from its own thread, all at once."""
    from service.serving.runtime import create_runtime
    from service.settings import Settings

    settings = Settings(device=device)
    sessions = settings.batching.sessions()
    runtimes = [create_runtime(path, settings, sessions) for _ in range(sessions)]
    rows = []
    for batch in batches:
        x = np.random.default_rng(0).random((batch, *shape), dtype=np.float32)
        for runtime in runtimes:
            runtime.run(x)
        start = time.perf_counter()

        def calls(runtime, x=x, start=start) -> int:
            n = 0
            while time.perf_counter() - start < seconds:
                runtime.run(x)
                n += 1
            return n

        with ThreadPoolExecutor(len(runtimes)) as pool:
            n = sum(pool.map(calls, runtimes))
        elapsed = time.perf_counter() - start
        rows.append(
            {
                "batch": batch,
                "sessions": sessions,
                "provider": runtimes[0].provider,
                "rows_per_s": n * batch / elapsed,
                "ms_per_call": 1000 * elapsed * sessions / n,
            }
        )
    return rows


def body(model: str | None, shape: tuple, rows: int) -> str:
    x = np.random.default_rng(1).random((rows, *shape)).round(3).tolist()
    return json.dumps({"inputs": x} | ({"model": model} if model else {}))


def run_load(url: str, payload: str, connections: int, seconds: float, rows: int, warm_up: bool) -> dict:
    """One closed-loop load point; with ``warm_up`` (the first point of a server and request shape) a
    second of the same load is run first and discarded."""
    if warm_up:
        wrk(url, payload, connections, 1.0)
    result = wrk(url, payload, connections, seconds)
    return result | {"rows_per_s": result["requests_per_s"] * rows}


def baseline_server(model_path: Path, device: str) -> Server:
    """The no-batching baseline (bench/serving/baseline_app.py) serving ``model_path`` on ``device``."""
    return Server(
        [PYTHON, "-m", "bench.serving.baseline_app", "--model", str(model_path), "--device", device], "/health"
    )


def floor_server(model_path: Path | None = None) -> Server:
    """The floor app (bench/serving/floor_app.py) on uvicorn as the service runs it: uvloop and httptools, one
    worker, no access log; with ``model_path``, the batching floor serving that model."""
    return Server(
        [PYTHON, "-m", "uvicorn", "bench.serving.floor_app:app", "--no-access-log", "--log-level", "warning"],
        "/",
        {"FLOOR_MODEL": str(model_path)} if model_path else None,
    )


def raw_at(model_path: Path, formed: float | None, seconds: float, device: Device, model: str = HEAVY) -> dict:
    """onnxruntime alone (``raw_onnxruntime``) at the whole batch size nearest the mean ``formed`` (1 when none)."""
    return raw_onnxruntime(model_path, SHAPES[model], seconds, (max(1, round(formed or 1.0)),), device)[0]


def batching_floor(
    stats: Callable[[], dict], load: Callable[[], dict], seconds: float, model_path: Path, device: Device
) -> dict:
    """A batching floor's rows/s under ``load`` over onnxruntime alone at the batch size it formed, from its ``stats``
    (the rows and onnxruntime calls it has run: ``GET /`` of floor_app, ``/floor.Floor/Stats`` of grpc_floor_app)."""
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
    """The most any server on this HTTP stack can reach against onnxruntime alone, for one protocol.
    onnxruntime alone keeps every core busy, so it spends t = cores / (its rows/s) CPU seconds a row; a
    server of single-row requests also spends at least the floor app's CPU f per request (``url``, process
    ``pid``), and the client w, so on the same cores it serves at most cores / (t + f + w) rows/s: a ratio
    of at most t / (t + f + w). f and w are measured here at ``clients`` clients."""
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


def grpc_target(svc: Server) -> str:
    """The service's gRPC address (its /health names the port)."""
    return f"127.0.0.1:{httpx.get(f'{svc.url}/health').json()['grpc_port']}"


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


def providers(svc: Server) -> dict[str, str]:
    """The execution provider each model of ``svc`` really runs on (its /health)."""
    return {m["name"]: m["provider"] for m in httpx.get(f"{svc.url}/health").json()["models"]}


def v2_binary_body(model: str, shape: tuple, rows: int) -> tuple[bytes, int]:
    """The body tritonclient.http sends for a binary-tensor v2 inference of ``rows`` seeded rows of ``shape``
    (``v2_binary_request``: JSON header, then the raw float32 bytes; the probabilities asked back as raw
    bytes) and the header's length."""
    return v2_binary_request(np.random.default_rng(1).random((rows, *shape), dtype=np.float32))


def check_with_tritonclient(svc: Server, model: str, shape: tuple) -> None:
    """One binary inference through tritonclient.http itself: the probabilities of every row sum to one."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(svc.url.removeprefix("http://"))
    tensor = triton.InferInput("input", [2, *shape], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(2).random((2, *shape), dtype=np.float32), binary_data=True)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("probabilities", binary_data=True)])
    np.testing.assert_allclose(result.as_numpy("probabilities").sum(axis=1), 1.0, atol=1e-4)
    client.close()


def binary_load(work: Path, model: str = HEAVY) -> str:
    """The wrk script of ``model``'s single-row binary v2 requests (its body written under ``work``)."""
    binary, header_length = v2_binary_body(model, SHAPES[model], 1)
    (work / f"{model}-v2-binary.bin").write_bytes(binary)
    return binary_lua(work / f"{model}-v2-binary.bin", header_length)


def single_row_requests(lua: str, model: str = HEAVY) -> dict[str, tuple[str, str | None, str | None]]:
    """``model``'s single-row request per protocol, as (path, JSON body, wrk script): JSON /predict, and v2 infer
    with binary tensors through ``lua`` (``binary_load`` of the same model)."""
    return {
        "json": ("/predict", body(model, SHAPES[model], 1), None),
        "binary": (f"/v2/models/{model}/infer", None, lua),
    }


def binary_lua(body_file: Path, header_length: int) -> str:
    """A wrk script that POSTs the binary v2 body in ``body_file``."""
    return (
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/octet-stream"\n'
        f'wrk.headers["Inference-Header-Content-Length"] = "{header_length}"\n'
        f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
    )


def formed_batch(svc: Server, before: dict, model: str) -> float | None:
    """Mean rows per onnxruntime call of ``model`` since the ``histogram_totals`` snapshot ``before``."""
    return histogram_means(before, histogram_totals(svc.url), [f"batch:{model}"])[f"batch:{model}"]


def sweep(svc: Server, concurrency, request_rows, seconds: float, result: dict) -> None:
    """The service's load points, its time split per model and the batch size it formed at each point."""
    for model, shape in SHAPES.items():
        start = histogram_totals(svc.url)
        for rows in request_rows:
            for c in concurrency:
                before = histogram_totals(svc.url)
                point = run_load(f"{svc.url}/predict", body(model, shape, rows), c, seconds, rows, c == concurrency[0])
                formed = formed_batch(svc, before, model)
                result["load"].append(
                    {"server": "service", "model": model, "rows": rows, "clients": c, "mean_batch_rows": formed} | point
                )
        drained_queue(svc)  # the last REST point's queued rows must not be counted against gRPC
        grpc_load(grpc_target(svc), model, concurrency[0], 1.0)  # warm-up, discarded
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
    svc: Server, artifacts: Path, clients: int, seconds: float, rounds: int, device: Device, lua: str
) -> dict:
    """The heavy model's goals measured in alternating rounds (``ab_rounds``), so that a drift of the machine's
    speed hits all alike: the service at ``clients`` single-row clients through JSON /predict and through v2
    with the binary tensor extension (the body tritonclient.http sends), onnxruntime alone at the batch
    size the service formed in each (from its histograms), the floor app's ceiling and the batching floor's
    ratio per protocol (``ceiling``, ``batching_floor``), and the no-batching baseline at ``clients``
    clients; the others idle meanwhile (``lua``: the wrk script of the binary requests). Per ratio, the
    median round."""
    model_path = artifacts / HEAVY / "1" / "model.onnx"
    requests, baseline_payload = single_row_requests(lua), body(None, SHAPES[HEAVY], 1)
    check_with_tritonclient(svc, HEAVY, SHAPES[HEAVY])
    measured = []
    baseline, floor, batching = baseline_server(model_path, device), floor_server(), floor_server(model_path)
    grpc_floor, target = grpc_floor_server(model_path), grpc_target(svc)
    try:
        grpc_load(target, HEAVY, clients, 1.0)  # warm-ups, discarded
        grpc_load(f"127.0.0.1:{grpc_floor.port}", HEAVY, clients, 1.0)
        for path, side_payload, side_lua in requests.values():  # warm-ups, discarded
            wrk(svc.url + path, side_payload, clients, 1.0, lua=side_lua)
            wrk(batching.url + path, side_payload, clients, 1.0, lua=side_lua)
        wrk(f"{baseline.url}/predict", baseline_payload, clients, 1.0)
        wrk(f"{floor.url}/predict", requests["json"][1], clients, 1.0)
        floor_stats = {
            "json": lambda: httpx.get(batching.url).json(),
            "binary": lambda: httpx.get(batching.url).json(),
            "grpc": lambda: _grpc_floor_stats(grpc_floor.port),
        }

        def measure_side(side: str, _round: int) -> dict:
            if side == "baseline":
                return {
                    "baseline_rows_per_s": wrk(f"{baseline.url}/predict", baseline_payload, clients, seconds)[
                        "requests_per_s"
                    ]
                }
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
            measured_floor |= batching_floor(floor_stats[side], floor_load, seconds, model_path, device)
            return row | {f"{side}_{key}": value for key, value in measured_floor.items()}

        for sides in ab_rounds(("json", "binary", "grpc", "baseline"), rounds, measure_side):
            row = {key: value for side in sides.values() for key, value in side.items()}
            measured.append(row | {"json_vs_baseline": row["json_rows_per_s"] / row["baseline_rows_per_s"]})
    finally:
        baseline.stop()
        floor.stop()
        batching.stop()
        grpc_floor.stop()
    return {"clients": clients, "rounds": measured} | {
        key: sorted(measured, key=lambda r: r[key])[len(measured) // 2]
        for key in ("json_vs_raw", "binary_vs_raw", "grpc_vs_raw", "json_vs_baseline")
    }


def logging_cpu(
    artifacts: Path, work: Path, clients: int, seconds: float, rounds: int, payloads: dict, smoke: bool, device: str
) -> list[dict]:
    """CPU seconds the server process spends per 10,000 single-row /predict requests, with prediction
    logging off, to SQLite and to PostgreSQL, each in ``PROCESSES`` processes on empty stores (a smoke run: one
    process each, no PostgreSQL).

    Requests/s of two identical processes differ by more than the cost to be measured; the CPU time a
    process spends per request is a far steadier measure. Each measurement is
    a ``seconds`` wrk run at ``clients`` clients; the process's user + system time (``/proc/<pid>/stat``)
    is read before it and after the prediction log has written every row of it, so the writes count.
    The load visits every process in alternating rounds (``ab_rounds``), ``rounds`` times. The
    database server's own CPU (PostgreSQL) is not counted: it is the cost on the serving host."""
    stores = {"off": False, "sqlite": True} | ({} if smoke else {"postgresql": True})
    processes = 1 if smoke else PROCESSES
    servers = {}
    samples: dict[tuple, list[float]] = {}
    try:
        for store, log in stores.items():
            for i in range(processes):
                url = (
                    "postgresql+psycopg://postgres@127.0.0.1:5432/test"
                    if store == "postgresql"
                    else f"sqlite:///{work / f'{store}-{i}.db'}"
                )
                servers[(store, i)] = service(artifacts, url, log, device)
        for model in SHAPES:

            def cpu_per_10k(server: tuple, _round: int, model: str = model) -> list[float]:
                svc, cpu = servers[server], process_cpu_seconds(servers[server].process.pid)
                requests = wrk(f"{svc.url}/predict", payloads[model], clients, seconds)["requests"]
                drained(svc)
                return [10_000 * (process_cpu_seconds(svc.process.pid) - cpu) / requests]

            def warm_up(server: tuple, model: str = model) -> None:
                wrk(f"{servers[server].url}/predict", payloads[model], clients, 1.0)
                drained(servers[server])

            for runs in ab_rounds(list(servers), rounds, cpu_per_10k, warm_up):
                for (store, _i), cpu in runs.items():
                    samples.setdefault((store, model), []).extend(cpu)
    finally:
        for svc in servers.values():
            svc.stop()
    return [
        {"logging": store, "model": model, "clients": clients, "processes": processes, "rounds": rounds}
        | cpu_summary(samples[(store, model)], samples[("off", model)])
        for model in SHAPES
        for store in stores
    ]


def drained_queue(svc: Server, timeout: float = 120.0) -> None:
    """Wait until no model of ``svc`` has rows queued for its batcher (a closed-loop load's last requests)."""
    deadline = time.monotonic() + timeout
    while (
        any(m["queued_rows"] for m in httpx.get(f"{svc.url}/health").json()["models"]) and time.monotonic() < deadline
    ):
        time.sleep(0.05)


def drained(svc: Server, timeout: float = 60.0) -> None:
    """Wait until the prediction log of ``svc`` has written every queued row."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{svc.url}/health").json()["storage"]["prediction_log_pending"] and time.monotonic() < deadline:
        time.sleep(0.05)


def cpu_summary(samples: list[float], off: list[float]) -> dict:
    """CPU seconds per 10,000 requests (mean, sd and range of the measurements) and the extra CPU over
    the same model without logging: the ratio of the means minus one, and its range over the ratios of
    the measurements taken in the same round and process slot."""
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
    """One round of the soak's steady mixed load: single-row predictions of both models (16 clients),
    a batch of 1000 labels and a calibration report."""
    wrk(f"{svc.url}/predict", payloads[LIGHT], 16, max(1.0, seconds * 0.7))
    wrk(f"{svc.url}/predict", payloads[HEAVY], 16, max(1.0, seconds * 0.3))
    client.post("/feedback", json={"items": monitoring.offline_items(1000, seed=3)}).raise_for_status()
    client.get("/calibration", params={"window": "100000"}).raise_for_status()


def soak(svc: Server, minutes: float, warm: dict, started: float, payloads: dict) -> dict:
    """Steady mixed load until ``minutes`` of load have passed since ``started`` (the start of the
    warm-up); RSS sampled after every round. ``warm``: the sample taken at the end of the warm-up."""
    warm_rss = warm["rss_mib"]
    samples = [warm]
    deadline = started + 60 * minutes
    with httpx.Client(base_url=svc.url, timeout=120) as client:
        while not samples[1:] or time.monotonic() < deadline:
            mixed_load(svc, payloads, max(1.0, min(20.0, deadline - time.monotonic())), client)
            samples.append({"minutes": (time.monotonic() - started) / 60, "rss_mib": svc.rss_mib()})
    end = samples[-1]["rss_mib"]
    return {
        "warm_rss_mib": warm_rss,
        "end_rss_mib": end,
        "minutes": samples[-1]["minutes"],
        "growth": end / warm_rss - 1,
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
    """Per-request queue time (Server-Timing) with max_queue_delay_ms = QUEUE_DELAY_MS, 4 clients of the
    light model: a load that leaves the machine mostly idle."""
    with service(artifacts, database_url, False, device, CALIB_BATCHING__MAX_QUEUE_DELAY_MS=str(QUEUE_DELAY_MS)) as svc:
        asyncio.run(_queue_delays(svc.url, body(LIGHT, SHAPES[LIGHT], 1), 4, 1.0))
        delays = asyncio.run(_queue_delays(svc.url, body(LIGHT, SHAPES[LIGHT], 1), 4, seconds))
    return {
        "max_queue_delay_ms": QUEUE_DELAY_MS,
        "clients": 4,
        "requests": len(delays),
        "p50_ms": float(np.percentile(delays, 50)),
        "p99_ms": float(np.percentile(delays, 99)),
        "max_ms": float(np.max(delays)),
    }


RAW_COLUMNS = "batch sessions provider rows_per_s ms_per_call".split()


def run(
    seconds: float,
    concurrency: tuple[int, ...],
    request_rows: tuple[int, ...],
    stored_rows: int,
    soak_minutes: float,
    smoke: bool,
    device: Device,
) -> dict:
    """Two models: the default light one (LeNet-5 on 8x8 digits, where HTTP dominates) and a heavy one (an
    untrained CIFAR ResNet-56 on 32x32x3, where inference dominates), served on ``device``.

    1. onnxruntime alone (the service's providers, sessions, thread and I/O binding settings) at batch sizes
       ``BATCH_SIZES``.
    2. One service process ("soak server": both models, prediction logging to SQLite, a store pre-filled with
       ``stored_rows`` labelled predictions) is warmed up, then measured: closed-loop wrk load (``concurrency``
       clients; requests of ``request_rows`` rows), the batch sizes it formed and its own phase histograms; the
       heavy model's goals in rounds (the service through JSON /predict and through v2 binary tensors, onnxruntime
       alone at each batch size formed, and the baseline, in turn); GET /calibration latency and POST /feedback
       throughput (bench.serving.monitoring); then steady mixed load until ``soak_minutes`` of load, sampling its RSS.
    3. The no-batching baseline (``baseline_app``) under the same load; the server CPU time per request with
       prediction logging off, to SQLite and to PostgreSQL at the top concurrency (``PROCESSES`` processes each,
       visited in interleaved rounds); the configured max queue delay checked from the Server-Timing header at a
       load that does not saturate the machine.
    """
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
            result["providers"] = providers(svc)
            load_started = time.monotonic()
            # warm-up: every request shape of the sweep and of the heavy rounds (binary v2 too) at its top
            # concurrency, every report window and feedback batches, then one round of the soak's steady
            # load, so the reference RSS is taken in that steady regime, not at the transient peak of the
            # largest requests (also recorded)
            lua = binary_load(work)
            for model, shape in SHAPES.items():
                for rows in request_rows:
                    wrk(f"{svc.url}/predict", body(model, shape, rows), top, 1.0 if smoke else 3.0)
            path, payload, script = single_row_requests(lua)["binary"]
            wrk(svc.url + path, payload, top, 1.0 if smoke else 3.0, lua=script)
            shapes_rss = svc.rss_mib()
            windows = [w for w in (1_000, 100_000, 1_000_000) if w <= stored_rows]
            with httpx.Client(base_url=svc.url, timeout=120) as client:
                for window in windows:
                    client.get("/calibration", params={"window": str(window)}).raise_for_status()
                monitoring.feedback_throughput(svc.url, 1.0 if smoke else 3.0, 1000)
                mixed_load(svc, payloads, 1.0 if smoke else 20.0, client)
            warm = {"minutes": (time.monotonic() - load_started) / 60, "rss_mib": svc.rss_mib()}
            sweep(svc, concurrency, request_rows, seconds, result)
            result["heavy_rounds"] = heavy_rounds(svc, artifacts, top, seconds, 1 if smoke else 3, device, lua)
            calibration = monitoring.calibration_latency(svc.url, windows, 5 if smoke else 20)
            feedback = monitoring.feedback_throughput(svc.url, 2.0 if smoke else 5.0, 1000)
            measured_monitoring = {
                "rows": stored_rows,
                "fill_seconds": fill_seconds,
                "calibration": calibration,
                "feedback": feedback,
                "server": "the soak server (prediction logging on)",
            }
            memory = soak(svc, soak_minutes, warm, load_started, payloads) | {"after_shapes_rss_mib": shapes_rss}
        for model, shape in SHAPES.items():
            with baseline_server(artifacts / model / "1" / "model.onnx", device) as baseline:
                for rows in request_rows:
                    for c in concurrency:
                        point = run_load(
                            f"{baseline.url}/predict", body(None, shape, rows), c, seconds, rows, c == concurrency[0]
                        )
                        result["load"].append(
                            {"server": "baseline", "model": model, "rows": rows, "clients": c} | point
                        )

        # 2-second measurements: the six servers are visited in turn three times per model
        result["logging"] = logging_cpu(
            artifacts, work, top, min(seconds, 2.0), 1 if smoke else 3, payloads, smoke, device
        )
        result["queue_delay"] = queue_delay_check(artifacts, sqlite_url, 2.0 if smoke else 6.0, device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result | {"monitoring": measured_monitoring, "soak": memory}


def both_artifacts(work: Path) -> Path:
    """A model repository under ``work`` with the committed light model and the heavy one."""
    artifacts = work / "artifacts"
    shutil.copytree(ROOT / "artifacts" / LIGHT / "1", artifacts / LIGHT / "1")
    heavy_artifact(artifacts)
    return artifacts


def heavy_only(seconds: float, rounds: int, device: Device) -> dict:
    """``heavy_rounds`` alone on a fresh service (prediction logging on, a small SQLite store), after a warm-up."""
    work = Path(tempfile.mkdtemp(prefix="calib-bench-"))
    try:
        artifacts = both_artifacts(work)
        with service(artifacts, f"sqlite:///{work / 'bench.db'}", True, device) as svc:
            lua = binary_load(work)
            for path, payload, script in single_row_requests(lua).values():
                wrk(svc.url + path, payload, 64, seconds, lua=script)
            return heavy_rounds(svc, artifacts, 64, seconds, rounds, device, lua)
    finally:
        shutil.rmtree(work, ignore_errors=True)
