"""The serving benchmark's device run (``python -m bench.serving --device-run``, or ``python -m bench.gpu``, which
adds ``--device cuda``): calibrated probabilities served on the device the service really gets, in one command.

Two models (the light LeNet-5 on 8x8 digits and the heavy CIFAR ResNet-56 of ``bench.serving``), two protocols
(JSON ``/predict`` and v2 with binary tensors), SQLite as the store, wrk as the load. It measures:

- rows/s at 64 single-row clients against the no-batching baseline (``bench/serving/baseline_app.py``, same device) and
  against onnxruntime alone at the batch size the service formed; p50 and p99 at one client against raw
  single-row inference; the service's own stage times (its histograms, as in Server-Timing);
- the largest absolute difference between the probabilities of the same inputs served on this device and on
  the CPU, with TF32 off (the default) and, on CUDA, on;
- the device (GPU, driver, CUDA and cuDNN versions, onnxruntime), ``/health`` and ``/metrics`` naming the
  provider, and what the service does when CUDA is asked for and cannot run (GPUs hidden);
- an onnxruntime profile of the heavy model at the batch size the service formed.

Goals are ratios within this run (``bench.serving.goals.device_goals``). Writes ``gpu.json`` and ``gpu.md`` under
``--out``; ``bench.serving.recorded`` renders the committed records of such runs into docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from bench.common import Server, histogram_means, histogram_totals, machine, table, v2_binary_request, wrk
from bench.serving.goals import device_goals
from bench.serving.measure import (
    CUDA,
    HEAVY,
    LIGHT,
    PHASES,
    SHAPES,
    baseline_server,
    binary_load,
    body,
    both_artifacts,
    formed_batch,
    raw_at,
    service,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device

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
        baseline = baseline_server(artifacts / model / "1" / "model.onnx", device)
        try:
            payload = body(None, SHAPES[model], 1)
            wrk(f"{baseline.url}/predict", payload, CLIENTS, 1.0)
            out[model] = wrk(f"{baseline.url}/predict", payload, CLIENTS, seconds)["requests_per_s"]
        finally:
            baseline.stop()
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


def run(out: Path, device: Device, artifacts: Path | None, seconds: float) -> dict:
    """Every measurement of the module docstring, in one process tree; the result is also written to ``out``."""
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
    (out / "gpu.md").write_text(report(result))
    return result


SWEEP_COLUMNS = ["round", "setting", "ready_seconds", "rows_per_s", "batch", "queue_ms", "inference_ms"]


POINT_COLUMNS = (
    "model protocol rows_per_s batch raw_rows_per_s vs_raw p50_1_client_ms p99_1_client_ms queue_ms inference_ms "
    "parse_ms encode_ms total_ms non_2xx"
).split()


def report(result: dict) -> str:
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
