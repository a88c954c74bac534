"""The device runs, in one command each (``python -m bench.gpu``; decisions 0001 and 0027), and the rendering of
every recorded run (``recorded_section``, docs/benchmarks.md's GPU section, from docs/benchmarks/gpu/*.json).

    python -m bench.gpu --prepare DIR                    # the two-model repository (needs torch), to carry
    python -m bench.gpu --out DIR --artifacts DIR [--device cuda]
    python -m bench.gpu --out DIR --device cpu --smoke   # the rehearsal, a few seconds per point
    python -m bench.gpu --engine --out DIR --artifacts DIR --seconds 2 [--frontends 1,4,12] [--no-replicas]
    python -m bench.gpu --engine --before .before --frontends 12 --out DIR --artifacts DIR   # issue 65's table

The device is ``cuda`` unless ``--device`` names another. Three runs:

**The device run** (``run_device``): calibrated probabilities served on the device the service really gets. Two
models (the light LeNet-5 on 8x8 digits and the heavy CIFAR ResNet-56 of ``bench.serving``), two protocols (JSON
``/predict`` and v2 with binary tensors), SQLite as the store, wrk as the load. It measures rows/s at 64 single-row
clients against the no-batching baseline (``bench/serving/baseline_app.py``, same device) and against onnxruntime
alone at the batch size the service formed; p50 and p99 at one client against raw single-row inference; the
service's own stage times (its histograms, as in Server-Timing); the largest absolute difference between the
probabilities of the same inputs served on this device and on the CPU, with TF32 off (the default) and, on CUDA,
on; the device (GPU, driver, CUDA and cuDNN versions, onnxruntime), ``/health`` and ``/metrics`` naming the provider,
and what the service does when CUDA is asked for and cannot run (GPUs hidden); an onnxruntime profile of the heavy
model at the batch size the service formed. Goals: ``bench.serving.goals.device_goals``. Writes ``gpu.json`` and
``gpu.md`` under ``--out``.

**The pod** (issue 54, ``--engine``, ``run_pod``): W front-ends feeding one engine. For W in ``--frontends`` (1 is
today's in-process path), each of the two models, each protocol (v2 binary tensors, JSON ``/predict``, gRPC
``ModelInfer`` over at least 2W HTTP/2 connections) and each count of single-row clients (64, 128): requests/s, the
batch the engine formed, the CPU per request of the front-ends and of the engine (from /proc), the engine's
inference busy share (its inference histogram over the wall time) and the GPU's utilisation (NVML); at one client
p50, p99 and the mean round trip, queue and inference. Then the same load on two plain replicas (W = 1 each, a CUDA
context each, the clients split between them), onnxruntime alone at every batch that was formed and at the bucket
it is padded to on CUDA (``vs_padded``: rows/s against the padded call, scaled to the rows used), and the
probabilities of every W against the CPU path. Goals: ``bench.serving.goals.pod_goals``. Writes
``engine-gpu.json`` (after every stage, so that a run cut short still returns what it measured) and
``engine-gpu.md`` under ``--out``.

**The engine at the device's limit** (issue 65, ``--engine --before DIR``, ``run_limit``): this tree's pod against
the pod of the source tree ``DIR`` (today's engine), side by side in one run, because repeat runs of one
configuration move by more than the changes measured. One W (``--frontends``, its first value) and the heavy model
over binary v2 at 128 single-row clients, on these pods in turn, each started, warmed up for a second and measured
for ``--seconds``: 1. ``new``: this tree, with the engine's per-batch timeline on (``CALIB_POD__TIMELINE``); 2.
``before``: the tree ``DIR``; 3. ``graphs``: this tree with ``CALIB_RUNTIME__CUDA_GRAPHS`` (its fallback, if any, is
recorded); 4. ``window 8``: this tree with the front-ends' window free to widen up to 8 (``CALIB_POD__MAX_WINDOW``);
5. ``new again``: the first configuration once more, to show the run's drift. Each pod also serves the light
model's single rows (binary, 128 clients), one heavy client alone (p50), and the probabilities of both models for
the parity check. Then onnxruntime alone at every batch formed and every bucket padded to (and, with graphs, the
service's runtime with graphs at those buckets), and the CPU path's probabilities. From the timeline: the engine's
time per batch (taken to answered) against onnxruntime alone at the bucket, and the share of time its sessions ran,
their idle time split into "no work" (nothing queued when the thread came back) and "waiting" (rows queued: the GIL
or the lock). Writes ``limit.json`` (after every stage) and ``limit.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from bench.common import (
    HEAVY,
    LIGHT,
    ROOT,
    Server,
    children,
    histogram_means,
    histogram_totals,
    machine,
    process_cpu_seconds,
    save_stage,
    service,
    table,
    v2_binary_request,
    wrk,
)
from bench.serving.goals import REPLICAS, device_goals, pod_goals
from bench.serving.grpc_load import load as grpc_load
from bench.serving.measure import (
    CUDA,
    PHASES,
    SHAPES,
    baseline_server,
    binary_load,
    body,
    both_artifacts,
    drained_queue,
    formed_batch,
    raw_at,
    raw_onnxruntime,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device

RECORDED = ROOT / "docs" / "benchmarks" / "gpu"

CLIENTS = 64
PARITY_ROWS = 64


def v2_binary_outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    """The output tensors of a v2 response: binary ones after the JSON header (its length in the
    ``Inference-Header-Content-Length`` header), in the header's order; JSON ones from their ``data``."""
    length = int(response.headers.get("inference-header-content-length", len(response.content)))
    header, offset, out = json.loads(response.content[:length]), length, {}
    dtypes = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
    for output in header["outputs"]:
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[output["name"]] = np.asarray(output["data"]).reshape(output["shape"])
            continue
        raw = response.content[offset : offset + size]
        offset += size
        out[output["name"]] = np.frombuffer(raw, dtype=dtypes[output["datatype"]]).reshape(output["shape"])
    return out


def inputs(model: str, rows: int, seed: int = 7) -> np.ndarray:
    """``rows`` seeded inputs of ``model``'s shape, in [0, 1) like its preprocessed images."""
    return np.random.default_rng(seed).random((rows, *SHAPES[model]), dtype=np.float32)


def served_probabilities(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """The probabilities ``url`` serves for ``x`` through v2 binary tensors (float32, bit-exact)."""
    payload, header_length = v2_binary_request(x)
    response = httpx.post(
        f"{url}/v2/models/{model}/infer",
        content=payload,
        timeout=60,
        headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)},
    )
    response.raise_for_status()
    return v2_binary_outputs(response)["probabilities"]


def device_report(device: str) -> dict:
    """What the numbers were measured on: the machine, the GPU (nvidia-smi), onnxruntime, and the CUDA runtime
    and cuDNN versions of the libraries loaded into this process (after ``preload_cuda_libraries``)."""
    import onnxruntime as ort

    from service.serving.runtime import loaded_cuda_libraries, preload_cuda_libraries

    libraries = preload_cuda_libraries(device)
    report = {
        "machine": machine(),
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "cuda_libraries_after_preload": libraries,
    }
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        name, driver, memory = (part.strip() for part in smi.splitlines()[0].split(","))
        report |= {"gpu": name, "driver": driver, "gpu_memory": memory}
        header = re.search(r"CUDA Version:\s*([\d.]+)", _run(["nvidia-smi"]) or "")
        report["driver_cuda"] = header.group(1) if header else None
    report["cuda_runtime"], report["cudnn"] = _library_versions(loaded_cuda_libraries())
    return report


def _library_versions(paths: list[str]) -> tuple[str | None, str | None]:
    """The CUDA runtime's (``cudaRuntimeGetVersion``) and cuDNN's (``cudnnGetVersion``) versions, from the loaded
    libraries' own entry points."""
    runtime = cudnn = None
    for path in paths:
        name = Path(path).name
        try:
            if name.startswith("libcudart.so") and runtime is None:
                value = ctypes.c_int()
                if ctypes.CDLL(path).cudaRuntimeGetVersion(ctypes.byref(value)) == 0:
                    runtime = f"{value.value // 1000}.{value.value % 1000 // 10}"
            elif name.startswith("libcudnn.so") and cudnn is None:
                library = ctypes.CDLL(path)
                library.cudnnGetVersion.restype = ctypes.c_size_t
                v = library.cudnnGetVersion()
                major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)  # cuDNN 9 changed it
                cudnn = f"{major}.{rest // 100}.{v % 100}"
        except (OSError, AttributeError):
            continue
    return runtime, cudnn


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def single_row_latency(path: Path, device: Device, seconds: float) -> dict:
    """Raw single-row inference: one of the service's sessions (same providers, threads, options) called back to
    back on one row; p50 and p99 ms per call."""
    from service.serving.runtime import create_runtime
    from service.settings import BatchingConfig, Settings

    runtime = create_runtime(path, Settings(device=device), BatchingConfig().sessions())
    x = np.random.default_rng(0).random((1, *runtime.session.get_inputs()[0].shape[1:]), dtype=np.float32)
    for _ in range(20):
        runtime.run(x)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        runtime.run(x)
        times.append(1000 * (time.perf_counter() - start))
    return {
        "provider": runtime.provider,
        "calls": len(times),
        "p50_ms": float(np.percentile(times, 50)),
        "p99_ms": float(np.percentile(times, 99)),
    }


def onnxruntime_profile(path: Path, device: Device, batch: int, calls: int, work: Path) -> dict:
    """onnxruntime's profiler on one session at ``batch`` rows: the mean ``model_run`` time, the time its nodes'
    kernels take (launches on CUDA, where kernels run asynchronously), the host-device copies, and the five
    op types that take the longest."""
    from service.serving.runtime import create_runtime
    from service.settings import Settings

    runtime = create_runtime(path, Settings(device=device), 1, profile=work / f"ort-{path.parent.parent.name}")
    x = np.random.default_rng(0).random((batch, *runtime.session.get_inputs()[0].shape[1:]), dtype=np.float32)
    warm = 5
    for _ in range(warm + calls):
        runtime.run(x)
    trace = json.loads(Path(runtime.session.end_profiling()).read_text())
    runs = [e["dur"] for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"][warm:]
    nodes = [e for e in trace if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    nodes = nodes[len(nodes) * warm // (warm + calls) :]
    by_op: dict[str, float] = {}
    for event in nodes:
        op = event.get("args", {}).get("op_name", "?")
        by_op[op] = by_op.get(op, 0.0) + event["dur"] / 1000 / max(1, len(runs))
    copies = sum(ms for op, ms in by_op.items() if op.startswith("Memcpy"))
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:5]
    return {
        "provider": runtime.provider,
        "batch": batch,
        "runs": len(runs),
        "model_run_ms": float(np.mean(runs)) / 1000 if runs else None,
        "node_kernels_ms": sum(by_op.values()),
        "memcpy_ms": copies,
        "top_ops": ", ".join(f"{op} {ms:.3f}" for op, ms in top),
    }


def service_points(svc: Server, artifacts: Path, device: Device, seconds: float, work: Path) -> list[dict]:
    """Per model and protocol: rows/s at CLIENTS single-row clients, the batch formed, onnxruntime alone at that
    batch, the service's stage means (ms, its histograms; the parse to encode stages are JSON /predict's), and p50
    and p99 at one client."""
    rows = []
    for model in (HEAVY, LIGHT):
        path = artifacts / model / "1" / "model.onnx"
        for protocol, (route, payload, lua) in single_row_requests(binary_load(work, model), model).items():
            url = svc.url + route
            wrk(url, payload, CLIENTS, 1.0, lua=lua)  # warm-up: the batch sizes this load forms
            before = histogram_totals(svc.url)
            loaded = wrk(url, payload, CLIENTS, seconds, lua=lua)
            after = histogram_totals(svc.url)
            formed = formed_batch(svc, before, model) or 1.0
            means = histogram_means(before, after, [*PHASES, f"queue:{model}", f"inference:{model}"])
            raw = raw_at(path, formed, seconds, device, model)
            one = wrk(url, payload, 1, seconds, lua=lua)
            rows.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "clients": CLIENTS,
                    "rows_per_s": loaded["requests_per_s"],
                    "non_2xx": loaded["non_2xx"] + one["non_2xx"],
                    "batch": formed,
                    "raw_rows_per_s": raw["rows_per_s"],
                    "vs_raw": loaded["requests_per_s"] / raw["rows_per_s"],
                    "p50_1_client_ms": one["p50_ms"],
                    "p99_1_client_ms": one["p99_ms"],
                }
                | {f"{k.split(':')[0]}_ms": None if v is None else 1000 * v for k, v in means.items()}
            )
    return rows


VARIANTS: dict[str, dict] = {  # str values, but a **dict[str, str] is checked against service()'s Path keywords
    "TF32 on": {"CALIB_RUNTIME__CUDA_TF32": "true"},
    "one session for all buckets": {"CALIB_RUNTIME__BUCKET_SESSIONS": "off"},
    "one session for all buckets, DEFAULT search": {
        "CALIB_RUNTIME__BUCKET_SESSIONS": "off",
        "CALIB_RUNTIME__CUDA_CONV_ALGO_SEARCH": "DEFAULT",
    },
}
"""CUDA settings measured beside the defaults (TF32 off, cuDNN's HEURISTIC algorithm choice, batches padded to
buckets with a session per bucket)."""


def variant_load(name: str, svc: Server, seconds: float, work: Path) -> dict:
    """The heavy model's rows/s at CLIENTS single-row clients per protocol on a service with other CUDA
    settings, and its p50 at one client through JSON."""
    row = {"variant": name}
    for protocol, (route, payload, lua) in single_row_requests(binary_load(work, HEAVY), HEAVY).items():
        wrk(svc.url + route, payload, CLIENTS, 1.0, lua=lua)
        row[f"{protocol}_rows_per_s"] = wrk(svc.url + route, payload, CLIENTS, seconds, lua=lua)["requests_per_s"]
        if protocol == "json":
            row["json_p50_1_client_ms"] = wrk(svc.url + route, payload, 1, seconds / 2, lua=lua)["p50_ms"]
    return row


def baseline_points(artifacts: Path, device: str, seconds: float) -> dict[str, float]:
    """The no-batching baseline's rows/s at CLIENTS single-row JSON clients, per model."""
    out = {}
    for model in (HEAVY, LIGHT):
        with baseline_server(artifacts / model / "1" / "model.onnx", device) as baseline:
            payload = body(None, SHAPES[model], 1)
            wrk(f"{baseline.url}/predict", payload, CLIENTS, 1.0)
            out[model] = wrk(f"{baseline.url}/predict", payload, CLIENTS, seconds)["requests_per_s"]
    return out


def provider_evidence(svc: Server) -> dict:
    """What ``/health`` and ``/metrics`` say runs each model."""
    health = httpx.get(f"{svc.url}/health").json()
    metrics = [
        line for line in httpx.get(f"{svc.url}/metrics").text.splitlines() if line.startswith("calib_model_info{")
    ]
    return {
        "status": health["status"],
        "device": health["device"],
        "cuda_libraries": health.get("cuda_libraries"),
        "models": {
            m["name"]: {k: m[k] for k in ("provider", "requested_providers", "io_binding", "sessions", "batch_buckets")}
            | {k: m.get(k) for k in ("cuda_graphs", "graph_fallback", "warmup_seconds", "staging_bytes")}
            for m in health["models"]
        },
        "metrics": metrics,
    }


def parity(urls: dict[str, str], reference: str) -> list[dict]:
    """The largest absolute difference of each server's probabilities from ``reference``'s, on the same
    PARITY_ROWS seeded inputs per model (one request each, binary tensors both ways)."""
    rows = []
    for model in (HEAVY, LIGHT):
        x = inputs(model, PARITY_ROWS)
        expected = served_probabilities(urls[reference], model, x)
        for name, url in urls.items():
            if name != reference:
                got = served_probabilities(url, model, x)
                rows.append(
                    {
                        "model": model,
                        "server": name,
                        "against": reference,
                        "rows": PARITY_ROWS,
                        "max_abs_diff": float(np.abs(got - expected).max()),
                        "argmax_agree": float(np.mean(got.argmax(1) == expected.argmax(1))),
                    }
                )
    return rows


def cuda_unavailable(artifacts: Path, work: Path) -> dict:
    """The service asked for CUDA where it cannot run (``CALIB_DEVICE=cuda`` with every GPU hidden through
    ``CUDA_VISIBLE_DEVICES``): whether it starts, what it serves on, what it logs, and one prediction."""
    log = work / "cuda-hidden.log"
    try:
        svc = service(
            artifacts,
            f"sqlite:///{work / 'hidden.db'}",
            False,
            "cuda",
            output=log,
            ready_path="/v2/health/live",
            CUDA_VISIBLE_DEVICES="",
            CALIB_LOG_LEVEL="info",
        )
    except RuntimeError as exc:
        return {"started": False, "error": str(exc), "log": log.read_text(errors="replace")[-2000:]}
    try:
        evidence = provider_evidence(svc)
        answer = httpx.post(
            f"{svc.url}/predict",
            content=body(HEAVY, SHAPES[HEAVY], 1),
            timeout=60,
            headers={"Content-Type": "application/json"},
        )
    finally:
        svc.stop()
    lines = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if re.search(r"CUDA|cuda|EP Error|Falling back", line)
    ]
    return {
        "started": True,
        "health": evidence,
        "predict_status": answer.status_code,
        "predict_error": answer.text[:300] if answer.status_code != 200 else None,
        "predict_provider": answer.json().get("provider") if answer.status_code == 200 else None,
        "log": lines[:12],
    }


def run_device(out: Path, device: Device, artifacts: Path | None, seconds: float) -> dict:
    """The device run of the module docstring, in one process tree; the result is also written to ``out``."""
    work = Path(tempfile.mkdtemp(prefix="calib-gpu-"))
    started = time.monotonic()
    try:
        if artifacts is None:
            artifacts = both_artifacts(work)
        result: dict = {"device_asked": device, "seconds_per_point": seconds, "device": device_report(device)}
        result["single_row"] = {
            model: single_row_latency(artifacts / model / "1" / "model.onnx", device, seconds / 2)
            for model in (HEAVY, LIGHT)
        }
        ready = time.monotonic()
        svc = service(artifacts, f"sqlite:///{work / 'main.db'}", True, device, output=work / "service.log")
        result["ready_seconds"] = time.monotonic() - ready
        try:
            result["evidence"] = provider_evidence(svc)
            result["points"] = service_points(svc, artifacts, device, seconds, work)
            on_cuda = result["evidence"]["models"][HEAVY]["provider"] == CUDA
            others = {"cpu": service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu")}
            ready_seconds = {}
            for name, env in VARIANTS.items() if on_cuda else ():
                ready = time.monotonic()
                others[name] = service(artifacts, f"sqlite:///{work / f'{len(others)}.db'}", False, device, **env)
                ready_seconds[name] = time.monotonic() - ready
            try:
                result["parity"] = parity({"service": svc.url} | {k: v.url for k, v in others.items()}, "cpu")
                result["variants"] = [
                    variant_load(name, others[name], seconds, work) | {"ready_seconds": ready_seconds[name]}
                    for name in others
                    if name in VARIANTS
                ]
            finally:
                for other in others.values():
                    other.stop()
        finally:
            svc.stop()
        result["baseline_rows_per_s"] = baseline_points(artifacts, device, seconds)
        heavy = next(p for p in result["points"] if p["model"] == HEAVY and p["protocol"] == "binary")
        result["profile"] = onnxruntime_profile(
            artifacts / HEAVY / "1" / "model.onnx", device, max(1, round(heavy["batch"])), 50, work
        )
        result["cuda_unavailable"] = cuda_unavailable(artifacts, work)
        result["goals"] = device_goals(result)
        result["minutes"] = (time.monotonic() - started) / 60
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "gpu.md").write_text(run_report(result))
    return result


SWEEP_COLUMNS = ["round", "setting", "ready_seconds", "rows_per_s", "batch", "queue_ms", "inference_ms"]


POINT_COLUMNS = (
    "model protocol rows_per_s batch raw_rows_per_s vs_raw p50_1_client_ms p99_1_client_ms queue_ms inference_ms "
    "parse_ms encode_ms total_ms non_2xx"
).split()


def run_report(result: dict) -> str:
    """The run as markdown: the device, the points, parity, the profile, CUDA unavailable, the goals."""
    d = result["device"]
    device = ", ".join(
        f"{k} {d.get(k)}"
        for k in ("gpu", "driver", "driver_cuda", "cuda_runtime", "cudnn", "onnxruntime")
        if d.get(k) is not None
    )
    cpu = d["machine"]
    single = [{"model": m} | v for m, v in result["single_row"].items()]
    providers = {m: v["provider"] for m, v in result["evidence"]["models"].items()}
    hidden = result["cuda_unavailable"]
    hidden_text = f"started: {hidden['started']}; " + (
        f"providers {json.dumps({m: v['provider'] for m, v in hidden['health']['models'].items()})}, "
        f"/predict {hidden['predict_status']} on {hidden['predict_provider']}; log: "
        + " / ".join(_log_gist(hidden["log"]))
        if hidden["started"]
        else hidden["error"]
    )
    lines = [
        f"## GPU run ({result['device_asked']}): {device or 'no GPU'}",
        f"CPU {cpu['cpu']} ({cpu['cores']} cores), commit {cpu['commit']}, {result['minutes']:.1f} minutes, "
        f"{result['seconds_per_point']} s per point; the service ready {result['ready_seconds']:.1f} s after "
        "its start",
        f"\nproviders (/health): {json.dumps(providers)}; "
        f"CUDA libraries: {len(result['evidence']['cuda_libraries'] or [])} loaded",
        "\n### The service at 64 single-row clients and at 1 (stage means in ms)\n"
        + table(result["points"], POINT_COLUMNS),
        "\nno-batching baseline rows/s at 64 clients: "
        + ", ".join(f"{m} {v:.0f}" for m, v in result["baseline_rows_per_s"].items()),
        "\n### Raw single-row inference\n" + table(single, ["model", "provider", "calls", "p50_ms", "p99_ms"]),
        "\n### Probabilities against the CPU path\n"
        + table(result["parity"], ["model", "server", "against", "rows", "max_abs_diff", "argmax_agree"]),
    ]
    if result["variants"]:
        lines.append(
            "\n### Other CUDA settings, heavy model at 64 clients\n"
            + table(
                result["variants"],
                ["variant", "json_rows_per_s", "binary_rows_per_s", "json_p50_1_client_ms", "ready_seconds"],
            )
        )
    lines += [
        "\n### onnxruntime profile, heavy model at the formed batch (ms per run)\n"
        + table(
            [result["profile"]],
            ["provider", "batch", "runs", "model_run_ms", "node_kernels_ms", "memcpy_ms", "top_ops"],
        ),
        f"\n### CUDA asked for where it cannot run (GPUs hidden)\n{hidden_text}",
        "\n### Goals\n" + table(result["goals"], ["goal", "measured", "target", "met"]),
    ]
    return "\n".join(lines) + "\n"


def _log_gist(lines: list[str]) -> list[str]:
    """The gist of the CUDA lines of a service log: onnxruntime's CUDA failure and the service's warnings."""
    gist = []
    for line in lines:
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        failure = re.search(r"CUDA failure \d+: [^;]*", line)
        if failure:
            gist.append(f"onnxruntime: {failure.group(0).strip()}")
        elif "WARNING" in line:
            gist.append(line.split("WARNING", 1)[1].strip()[:200])
    return list(dict.fromkeys(gist))


MODELS = (HEAVY, LIGHT)
PROTOCOLS = ("binary", "json", "grpc")
POD_CLIENTS = (64, 128)
POD_COLUMNS = (
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
    return served_probabilities(url, model, inputs(model, PARITY_ROWS))


def against_cpu(artifacts: Path, work: Path, probabilities: dict[str, dict[str, np.ndarray]], key: str) -> list[dict]:
    """The largest absolute difference of each server's (``key``: its label) probabilities of every model from the
    CPU path's."""
    with service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu", CALIB_FRONTENDS="1") as cpu:
        reference = {m: served(cpu.url, m) for m in MODELS}
    return [
        {key: name, "model": m, "max_abs_diff": float(np.abs(p[m] - reference[m]).max())}
        for name, p in probabilities.items()
        for m in MODELS
    ]


def sweep_service(servers: list[Server], w: int, seconds: float, work: Path, label: str) -> list[dict]:
    """Every (model, protocol, clients) point on ``servers``, a one-second warm-up per model and protocol; then one
    client, whose stage means (round trip, queue, inference) show where its latency goes."""
    rows = []
    for model in MODELS:
        for protocol in PROTOCOLS:
            drive(servers, model, protocol, POD_CLIENTS[0], 1.0, work, w)  # warm-up: the batch sizes this load forms
            for clients in POD_CLIENTS:
                row = {"frontends": label} | point(servers, model, protocol, clients, seconds, work, w)
                rows.append(row)
                print(table([row], POD_COLUMNS), flush=True)
            drained_queue(servers[0])  # the loaded point's last requests would count as the one client's
            time.sleep(0.2)
            rows.append({"frontends": label} | point(servers[:1], model, protocol, 1, 1.0, work, w))
    return rows


def run_pod(
    out: Path,
    device: Device,
    artifacts: Path,
    seconds: float,
    frontends: tuple[int, ...],
    deadline: float = 3.2,
    replicas: bool = True,
) -> dict:
    """The pod of the module docstring; no further W is started ``deadline`` minutes into the run, so that
    the run ends inside its machine's time with the replicas, onnxruntime alone and parity measured."""
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
        result["parity"] = against_cpu(artifacts, work, probabilities, "server")
        result["goals"] = pod_goals(result)
        save("parity and goals")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        (out / "engine-gpu.md").write_text(pod_report(result))
    return result


def pod_report(result: dict) -> str:
    device = result.get("device", {})
    loaded = [p for p in result["points"] if p["clients"] != 1]
    ones = [p for p in result["points"] if p["clients"] == 1]
    lines = [
        f"## The engine on {device.get('gpu', result['device_asked'])} (`python -m bench.gpu --engine`)",
        f"{json.dumps(device.get('machine', machine()))}; {result.get('minutes', 0):.1f} minutes, "
        f"{result['seconds_per_point']} s per point; ready seconds by W: {json.dumps(result.get('ready_seconds'))}",
        "\n### Single-row clients\n" + table(loaded, POD_COLUMNS),
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


LIMIT_CLIENTS = 128
LIMIT_COLUMNS = (
    "pod model clients requests_per_s batch vs_raw vs_padded engine_vs_bucket sessions_busy idle_no_work "
    "idle_waiting p50_ms errors"
).split()
#: The issue's targets, by the row's ``goal`` key.
LIMIT_TARGETS = {
    "engine time per batch / onnxruntime alone at the bucket": ("<=", 1.10),
    "share of time the sessions are busy": (">=", 0.90),
    "rows/s / onnxruntime alone at the bucket padded to": (">=", 0.8),
    "rows/s / onnxruntime alone at the batch formed": (">=", 0.75),
    "rows/s, new / before": (">=", 1.3),
    "p50 at one client - onnxruntime alone at one row (ms)": ("<=", 1.2),
    "light single rows, new / before": (">=", 0.95),
    "probabilities against the CPU path (max abs)": ("<=", 1e-5),
}


def timeline(path: Path, start: float, end: float) -> dict:
    """The engine's batches of the heavy model taken within [start, end] (``time.perf_counter`` is the system's
    monotonic clock, shared by the processes): per padded bucket their count and mean ms from take to answer, the
    sessions' busy share, and their idle time split by what was queued when each thread came back."""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    entries = [e for e in entries if e["model"].startswith(HEAVY) and start <= e["taken"] <= end]
    if not entries:
        return {}
    by_bucket: dict[int, list[float]] = {}
    threads: dict[str, dict[str, float]] = {}
    for e in entries:
        by_bucket.setdefault(padded_to(e["rows"]), []).append(1000 * (e["answered"] - e["taken"]))
        own = threads.setdefault(e["thread"], {"busy": 0.0, "no_work": 0.0, "waiting": 0.0})
        own["busy"] += e["ran"] - e["taken"]
        own["no_work" if e["queued_back"] == 0 else "waiting"] += e["taken"] - e["back"]
    wall = (end - start) * len(threads)
    return {
        "batches": len(entries),
        "engine_ms_by_bucket": {str(b): [len(v), float(np.mean(v))] for b, v in sorted(by_bucket.items())},
        "sessions_busy": sum(t["busy"] for t in threads.values()) / wall,
        "idle_no_work": sum(t["no_work"] for t in threads.values()) / wall,
        "idle_waiting": sum(t["waiting"] for t in threads.values()) / wall,
    }


def measure_pod(label: str, tree: Path, env: dict, artifacts: Path, device: Device, w: int, seconds: float, work: Path):
    """One pod from ``tree``: its points (heavy and light under load, one heavy client), its health and its
    probabilities."""
    line = work / f"{label.replace(' ', '-')}.timeline"
    extra: dict[str, str] = {"CALIB_FRONTENDS": str(w), **env}
    if tree == ROOT:  # a tree from before the timeline would refuse the setting
        extra["CALIB_POD__TIMELINE"] = str(line)
    db = f"sqlite:///{work / (label.replace(' ', '-') + '.db')}"
    with service(artifacts, db, True, device, None, "/v2/health/ready", tree, (), **extra) as svc:
        health = httpx.get(f"{svc.url}/health").json()
        probabilities = {m: served(svc.url, m) for m in (HEAVY, LIGHT)}
        points = []
        for model in (HEAVY, LIGHT):
            drive([svc], model, "binary", LIMIT_CLIENTS, 1.0, work, w)  # warm-up: the batch sizes this load forms
            started = time.perf_counter()
            row = {"pod": label} | point([svc], model, "binary", LIMIT_CLIENTS, seconds, work, w)
            if model == HEAVY:
                time.sleep(0.5)  # the last batches' timeline lines are written once their replies are sent
                row |= timeline(line, started, started + seconds)
            points.append(row)
            print(table([row], LIMIT_COLUMNS), flush=True)
        drained_queue(svc)
        points.append({"pod": label} | point([svc], HEAVY, "binary", 1, 1.0, work, w))
        return points, health, probabilities


def graph_runtime_ms(path: Path, device: Device, buckets: list[int]) -> dict[str, float]:
    """ms per call of the service's runtime with CUDA graphs at each bucket (empty when graphs fell back)."""
    from service.serving.runtime import create_runtime
    from service.settings import RuntimeSettings, Settings

    settings = Settings(device=device, runtime=RuntimeSettings(cuda_graphs=True))
    runtime = create_runtime(path, settings, 1, max_batch_size=settings.batching.max_batch_size)
    if not runtime.cuda_graphs:
        return {}
    out = {}
    for batch in buckets:
        x = np.random.default_rng(0).random((batch, *SHAPES[HEAVY]), dtype=np.float32)
        runtime.run(x)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.5:
            runtime.run(x)
            calls += 1
        out[str(batch)] = 1000 * (time.perf_counter() - start) / calls
    return out


def run_limit(out: Path, device: Device, artifacts: Path, seconds: float, before: Path, w: int) -> dict:
    """The engine at the limit of the module docstring, every stage, the JSON saved after each."""
    work = Path(tempfile.mkdtemp(prefix="calib-engine-limit-"))
    started = time.monotonic()
    result: dict = {"device_asked": device, "frontends": w, "seconds_per_point": seconds, "points": [], "health": {}}
    probabilities: dict[str, dict[str, np.ndarray]] = {}

    def save(stage: str) -> None:
        save_stage(out / "limit.json", result, stage, started)

    pods = [
        ("new", ROOT, {}),
        ("before", before.resolve(), {}),
        ("graphs", ROOT, {"CALIB_RUNTIME__CUDA_GRAPHS": "true"}),
        ("window 8", ROOT, {"CALIB_POD__MAX_WINDOW": "8"}),
        ("new again", ROOT, {}),
    ]
    try:
        result["device"] = device_report(device)
        result["single_row"] = single_row_latency(artifacts / HEAVY / "1" / "model.onnx", device, 1.0)
        save("single-row")
        for label, tree, env in pods:
            points, health, probabilities[label] = measure_pod(label, tree, env, artifacts, device, w, seconds, work)
            result["points"] += points
            result["health"][label] = [
                {k: m.get(k) for k in ("name", "batch_buckets", "cuda_graphs", "graph_fallback", "staging_bytes")}
                for m in health.get("models", [])
            ]
            save(label)
        heavy = [
            p for p in result["points"] if p["model"] == HEAVY and p["clients"] == LIMIT_CLIENTS and p.get("batch")
        ]
        formed = sorted(
            {max(1, round(p["batch"])) for p in heavy}
            | {padded_to(p["batch"]) for p in heavy}
            | {int(b) for p in heavy for b in p.get("engine_ms_by_bucket", {})}  # every bucket the engine ran
        )
        model = artifacts / HEAVY / "1" / "model.onnx"
        raw = {str(r["batch"]): r for r in raw_onnxruntime(model, SHAPES[HEAVY], 0.5, tuple(formed), device)}
        result["raw"] = {b: r["rows_per_s"] for b, r in raw.items()}
        result["raw_ms"] = {b: r["ms_per_call"] for b, r in raw.items()}
        buckets = sorted({padded_to(p["batch"]) for p in heavy})
        result["graphs_runtime_ms"] = graph_runtime_ms(model, device, buckets)
        for row in heavy:
            bucket = padded_to(row["batch"])
            row["vs_raw"] = row["requests_per_s"] / result["raw"][str(max(1, round(row["batch"])))]
            row["vs_padded"] = row["requests_per_s"] / (result["raw"][str(bucket)] * row["batch"] / bucket)
            spans = row.get("engine_ms_by_bucket", {})
            if spans:  # weighted by the batches run at each bucket
                n = sum(c for c, _ in spans.values())
                row["engine_vs_bucket"] = sum(c * ms / result["raw_ms"][b] for b, (c, ms) in spans.items()) / n
        save("onnxruntime alone")
        result["parity"] = against_cpu(artifacts, work, probabilities, "pod")
        if "graphs" in probabilities:
            result["graphs_vs_no_graphs"] = max(
                float(np.abs(probabilities["graphs"][m] - probabilities["new"][m]).max()) for m in (HEAVY, LIGHT)
            )
        result["goals"] = limit_goals(result)
        save("parity and goals")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "limit.md").write_text(limit_report(result))
    return result


def limit_goals(result: dict) -> list[dict]:
    """The issue's table from one run: each goal's measure on the ``new`` pod (its ratios to ``before`` and
    ``graphs`` in the same run), beside its target."""

    def at(pod: str, model: str, clients: int = LIMIT_CLIENTS) -> dict:
        return next(p for p in result["points"] if (p["pod"], p["model"], p["clients"]) == (pod, model, clients))

    new, old = at("new", HEAVY), at("before", HEAVY)
    measured = {
        "engine time per batch / onnxruntime alone at the bucket": new.get("engine_vs_bucket"),
        "share of time the sessions are busy": new.get("sessions_busy"),
        "rows/s / onnxruntime alone at the bucket padded to": new.get("vs_padded"),
        "rows/s / onnxruntime alone at the batch formed": new.get("vs_raw"),
        "rows/s, new / before": new["requests_per_s"] / old["requests_per_s"],
        "p50 at one client - onnxruntime alone at one row (ms)": at("new", HEAVY, 1)["p50_ms"]
        - result["single_row"]["p50_ms"],
        "light single rows, new / before": at("new", LIGHT)["requests_per_s"] / at("before", LIGHT)["requests_per_s"],
        "probabilities against the CPU path (max abs)": max(
            p["max_abs_diff"] for p in result["parity"] if p["pod"] != "before"
        ),
    }
    rows = []
    for goal, value in measured.items():
        sense, target = LIMIT_TARGETS[goal]
        met = None if value is None else (value <= target if sense == "<=" else value >= target)
        rows.append({"goal": goal, "measured": value, "target": f"{sense} {target:g}", "met": met})
    reported = {  # each pod's heavy rows/s against the first pod's, in the same run
        "rows/s, graphs / no graphs": "graphs",
        "rows/s, front-end window up to 8 / up to 2": "window 8",
        "drift: new again / new": "new again",
    }
    for goal, pod in reported.items():
        ratio = at(pod, HEAVY)["requests_per_s"] / new["requests_per_s"]
        rows.append({"goal": goal, "measured": ratio, "target": "reported", "met": None})
    return rows


def limit_report(result: dict) -> str:
    device = result.get("device", {})
    lines = [
        f"## The engine at the device's limit on {device.get('gpu', result['device_asked'])} "
        f"(`python -m bench.gpu --engine --before DIR`), W = {result['frontends']}",
        f"{result.get('minutes', 0):.1f} minutes, {result['seconds_per_point']} s per point; stages: "
        f"{', '.join(result.get('stages_done', []))}",
        "\n### Points\n" + table(result["points"], LIMIT_COLUMNS),
        "\n### Sessions\n" + json.dumps(result.get("health"), indent=1),
    ]
    if result.get("raw"):
        raw = [{"batch": b, "rows_per_s": r, "ms_per_call": result["raw_ms"][b]} for b, r in result["raw"].items()]
        lines.append("\n### onnxruntime alone\n" + table(raw, ["batch", "rows_per_s", "ms_per_call"]))
        lines.append(f"\nWith CUDA graphs (the service's runtime, ms per call): {result.get('graphs_runtime_ms')}")
    if result.get("parity"):
        lines.append("\n### Against the CPU path\n" + table(result["parity"], ["pod", "model", "max_abs_diff"]))
    if result.get("goals"):
        lines.append("\n### Goals\n" + table(result["goals"], ["goal", "measured", "target", "met"]))
    return "\n".join(lines) + "\n"


def recorded_section(folder: Path = RECORDED) -> str:
    """docs/benchmarks.md's GPU section: every recorded run (``run_report``, ``pod_report`` for ``kind`` "engine",
    ``limit_report`` for "limit") and settings sweep, by the session that recorded it (``recorded.session``, 1 when
    absent) and then by name."""
    out = [
        "## GPU runs (`python -m bench.gpu`)",
        "",
        "Recorded on lent GPU machines (the run is one command, `python -m bench.gpu --device cuda`, and "
        "`--engine` for the pod; docs/decisions/0001-gpu-run.md, 0020-bucket-sessions.md and 0027-engine-process.md "
        "say what was learnt). Each run's settings are named above its tables.",
    ]
    recorded = [(path, json.loads(path.read_text())) for path in folder.glob("*.json")]
    for path, data in sorted(recorded, key=lambda r: (r[1]["recorded"].get("session", 1), r[0].name)):
        note = f"\n*{path.name}: {data['recorded']['note']}.*\n"
        if data["recorded"].get("kind") == "engine":
            text = pod_report(data).replace("## The engine", f"## GPU run {path.stem}: the engine", 1)
            out += ["\n" + text.replace("\n", "\n" + note, 1).replace("\n### ", "\n#### ")]
        elif data["recorded"].get("kind") == "limit":
            text = limit_report(data).replace("## The engine", f"## GPU run {path.stem}: the engine", 1)
            out += ["\n" + text.replace("\n", "\n" + note, 1).replace("\n### ", "\n#### ")]
        elif "settings" in data:
            out += [
                f"\n## GPU settings sweep ({path.stem})",
                note,
                table(data["settings"], [c for c in SWEEP_COLUMNS if c in data["settings"][0]]),
            ]
            if data.get("batcher_alone"):
                out += [
                    "",
                    "The service's batcher and sessions alone (no HTTP), at the same load:",
                    "",
                    table(data["batcher_alone"], ["sessions", "provider", "rows_per_s", "batch", "onnxruntime_ms"]),
                ]
            out += [
                "",
                "onnxruntime alone at batch 32, beside a pure-Python thread:",
                "",
                table(
                    data["gil"],
                    ["python_thread_busy", "switch_interval_ms", "batch", "sessions", "rows_per_s", "ms_per_call"],
                ),
            ]
        else:
            out += [
                "\n"
                + run_report(data)
                .replace("## GPU run", f"## GPU run {path.stem},", 1)
                .replace("\n", "\n" + note, 1)
                .replace("\n### ", "\n#### ")
            ]
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
    parser.add_argument("--smoke", action="store_true", help="a second per point: the rehearsal")
    parser.add_argument("--frontends", default="1,4,12", help="with --engine: the numbers of front-ends, W")
    parser.add_argument("--deadline", type=float, default=3.2, help="with --engine: minutes after which no W starts")
    parser.add_argument("--no-replicas", action="store_true", help="with --engine: skip the two plain replicas")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="with --engine: this tree's engine against the source tree DIR's"
    )
    args = parser.parse_args(argv)
    if args.prepare:
        work = Path(tempfile.mkdtemp(prefix="calib-gpu-"))
        shutil.rmtree(args.prepare, ignore_errors=True)
        shutil.copytree(both_artifacts(work), args.prepare)
        shutil.rmtree(work, ignore_errors=True)
        print("two-model repository in", args.prepare)
        return
    if args.out is None:
        parser.error("--out is required (or --prepare)")
    seconds = 1.0 if args.smoke else args.seconds
    frontends = tuple(int(w) for w in args.frontends.split(","))
    if args.engine and args.before:
        print(limit_report(run_limit(args.out, args.device, args.artifacts, seconds, args.before, frontends[0])))
    elif args.engine:
        result = run_pod(args.out, args.device, args.artifacts, seconds, frontends, args.deadline, not args.no_replicas)
        print(pod_report(result))
    else:
        print(run_report(run_device(args.out, args.device, args.artifacts, seconds)))


if __name__ == "__main__":
    main()
