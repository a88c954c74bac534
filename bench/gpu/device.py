"""The device run (``python -m bench.gpu``): the service on the device it really gets, the light and heavy models
through JSON ``/predict`` and v2 binary tensors: rows/s at 64 single-row clients against the no-batching baseline and
onnxruntime alone at the batch formed; p50 and p99 at one client against raw inference; the service's stage times;
the probabilities against the CPU path's (TF32 off and on); the versions and provider; the service asked for CUDA
with every GPU hidden; an onnxruntime profile of the heavy model. Goals: ``bench.serving.goals.device_goals``."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from bench.common import (
    HEAVY,
    LIGHT,
    Server,
    histogram_means,
    histogram_totals,
    loopback,
    machine,
    service,
    table,
    v2_binary_request,
    warm,
    wrk,
)
from bench.serving.goals import device_goals
from bench.serving.harness import (
    CUDA,
    PHASES,
    SHAPES,
    baseline_server,
    body,
    both_artifacts,
    raw_at,
    single_row_requests,
)

if TYPE_CHECKING:
    from service.settings import Device

CLIENTS = 64
PARITY_ROWS = 64
MODELS = (HEAVY, LIGHT)


def v2_binary_outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    """The output tensors of a v2 response: binary ones after the JSON header (its length in the
    ``Inference-Header-Content-Length`` header), in the header's order; JSON ones from their ``data``."""
    length = int(response.headers.get("inference-header-content-length", len(response.content)))
    offset, out = length, {}
    dtypes = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
    for output in json.loads(response.content[:length])["outputs"]:
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[output["name"]] = np.asarray(output["data"]).reshape(output["shape"])
            continue
        raw = np.frombuffer(response.content[offset : offset + size], dtype=dtypes[output["datatype"]])
        out[output["name"]] = raw.reshape(output["shape"])
        offset += size
    return out


def served(url: str, model: str) -> np.ndarray:
    """The probabilities ``url`` serves for PARITY_ROWS seeded inputs of ``model``, v2 binary tensors both ways."""
    x = np.random.default_rng(7).random((PARITY_ROWS, *SHAPES[model]), dtype=np.float32)
    payload, header_length = v2_binary_request(x)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}
    response = loopback.post(f"{url}/v2/models/{model}/infer", content=payload, timeout=60, headers=headers)
    response.raise_for_status()
    return v2_binary_outputs(response)["probabilities"]


def device_report(device: str) -> dict:
    """The machine, the GPU, onnxruntime, and the CUDA runtime and cuDNN loaded into this process."""
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
    """The loaded CUDA runtime's and cuDNN's versions, from their own entry points."""
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


def call_ms(run: Callable[[np.ndarray], object], x: np.ndarray, seconds: float, warm: int = 20) -> list[float]:
    """ms of each call of ``run(x)``, called back to back for ``seconds`` after ``warm`` calls."""
    for _ in range(warm):
        run(x)
    times, deadline = [], time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        run(x)
        times.append(1000 * (time.perf_counter() - start))
    return times


def single_row_latency(path: Path, device: Device, seconds: float) -> dict:
    """p50 and p99 ms of raw single-row inference: one of the service's sessions called back to back."""
    from service.serving.runtime import create_runtime
    from service.settings import BatchingConfig, Settings

    runtime = create_runtime(path, Settings(device=device), BatchingConfig().sessions())
    x = np.random.default_rng(0).random((1, *runtime.session.get_inputs()[0].shape[1:]), dtype=np.float32)
    times = call_ms(runtime.run, x, seconds)
    p50, p99 = np.percentile(times, [50, 99])
    return {"provider": runtime.provider, "calls": len(times), "p50_ms": float(p50), "p99_ms": float(p99)}


def onnxruntime_profile(path: Path, device: Device, batch: int, calls: int, work: Path) -> dict:
    """onnxruntime's profiler on one session at ``batch`` rows: the mean ``model_run``, its kernels' time (launches
    on CUDA, where kernels run asynchronously), the host-device copies and the five longest op types."""
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
    by_op: dict[str, float] = {}
    for event in nodes[len(nodes) * warm // (warm + calls) :]:
        op = event.get("args", {}).get("op_name", "?")
        by_op[op] = by_op.get(op, 0.0) + event["dur"] / 1000 / max(1, len(runs))
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:5]
    return {
        "provider": runtime.provider,
        "batch": batch,
        "runs": len(runs),
        "model_run_ms": float(np.mean(runs)) / 1000 if runs else None,
        "node_kernels_ms": sum(by_op.values()),
        "memcpy_ms": sum(ms for op, ms in by_op.items() if op.startswith("Memcpy")),
        "top_ops": ", ".join(f"{op} {ms:.3f}" for op, ms in top),
    }


def service_points(svc: Server, artifacts: Path, device: Device, seconds: float, work: Path) -> list[dict]:
    """Per model and protocol: rows/s at CLIENTS clients, the batch, onnxruntime alone there, stages, p50 and p99."""
    rows = []
    for model in MODELS:
        for protocol, (route, payload, lua) in single_row_requests(work, model).items():
            url = svc.url + route
            warm(wrk, url, payload, CLIENTS, 1.0, lua=lua)  # the batch sizes this load forms
            before = histogram_totals(svc.url)
            load = wrk(url, payload, CLIENTS, seconds, lua=lua)
            means = histogram_means(
                before, histogram_totals(svc.url), [f"batch:{model}", *PHASES, f"queue:{model}", f"inference:{model}"]
            )
            formed = means.pop(f"batch:{model}") or 1.0
            raw = raw_at(artifacts / model / "1" / "model.onnx", formed, seconds, device, model)["rows_per_s"]
            one = wrk(url, payload, 1, seconds, lua=lua)
            rows.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "clients": CLIENTS,
                    "rows_per_s": load["requests_per_s"],
                    "non_2xx": load["non_2xx"] + one["non_2xx"],
                    "batch": formed,
                    "raw_rows_per_s": raw,
                    "vs_raw": load["requests_per_s"] / raw,
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
    """The heavy model's rows/s per protocol on a service with other CUDA settings, and its p50 at one client."""
    row = {"variant": name}
    for protocol, (route, payload, lua) in single_row_requests(work, HEAVY).items():
        url = svc.url + route
        row[f"{protocol}_rows_per_s"] = wrk(url, payload, CLIENTS, seconds, lua, warmed=True)["requests_per_s"]
        if protocol == "json":
            row["json_p50_1_client_ms"] = wrk(url, payload, 1, seconds / 2, lua=lua)["p50_ms"]
    return row


def baseline_points(artifacts: Path, device: str, seconds: float) -> dict[str, float]:
    """The no-batching baseline's rows/s at CLIENTS single-row JSON clients, per model."""
    out = {}
    for model in MODELS:
        with baseline_server(artifacts / model / "1" / "model.onnx", device) as baseline:
            out[model] = wrk(f"{baseline.url}/predict", body(None, SHAPES[model], 1), CLIENTS, seconds, warmed=True)[
                "requests_per_s"
            ]
    return out


def provider_evidence(svc: Server) -> dict:
    """What ``/health`` and ``/metrics`` say runs each model."""
    health = svc.get("/health").json()
    metrics = svc.get("/metrics").text.splitlines()
    return {
        "status": health["status"],
        "device": health["device"],
        "cuda_libraries": health.get("cuda_libraries"),
        "models": {
            m["name"]: {k: m[k] for k in ("provider", "requested_providers", "io_binding", "sessions", "batch_buckets")}
            | {k: m.get(k) for k in ("cuda_graphs", "graph_fallback", "warmup_seconds", "staging_bytes")}
            for m in health["models"]
        },
        "metrics": [line for line in metrics if line.startswith("calib_model_info{")],
    }


def parity(urls: dict[str, str], reference: str) -> list[dict]:
    """The largest absolute difference of each server's probabilities from ``reference``'s, on the same inputs."""
    rows = []
    for model in MODELS:
        expected = served(urls[reference], model)
        for name, url in urls.items():
            if name != reference:
                got = served(url, model)
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
    """The service asked for CUDA with every GPU hidden: whether it starts, on what, what it logs, one prediction."""
    log = work / "cuda-hidden.log"
    hidden: dict = {"CUDA_VISIBLE_DEVICES": "", "CALIB_LOG_LEVEL": "info"}
    try:
        svc = service(artifacts, f"sqlite:///{work / 'hidden.db'}", False, "cuda", log, "/v2/health/live", **hidden)
    except RuntimeError as exc:
        return {"started": False, "error": str(exc), "log": log.read_text(errors="replace")[-2000:]}
    with svc:
        evidence = provider_evidence(svc)
        headers = {"Content-Type": "application/json"}
        answer = loopback.post(f"{svc.url}/predict", content=body(HEAVY, SHAPES[HEAVY], 1), timeout=60, headers=headers)
    lines = log.read_text(errors="replace").splitlines()
    ok = answer.status_code == 200
    return {
        "started": True,
        "health": evidence,
        "predict_status": answer.status_code,
        "predict_error": None if ok else answer.text[:300],
        "predict_provider": answer.json().get("provider") if ok else None,
        "log": [line for line in lines if re.search(r"CUDA|cuda|EP Error|Falling back", line)][:12],
    }


def run_device(out: Path, device: Device, artifacts: Path | None, seconds: float) -> dict:
    """The device run of the module docstring, in one process tree; the result is also written to ``out``."""
    work = Path(tempfile.mkdtemp(prefix="calib-gpu-"))
    started = time.monotonic()
    try:
        artifacts = artifacts or both_artifacts(work)
        result: dict = {"device_asked": device, "seconds_per_point": seconds, "device": device_report(device)}
        result["single_row"] = {
            model: single_row_latency(artifacts / model / "1" / "model.onnx", device, seconds / 2) for model in MODELS
        }
        with ExitStack() as stack:
            ready = time.monotonic()
            svc = stack.enter_context(
                service(artifacts, f"sqlite:///{work / 'main.db'}", True, device, work / "service.log")
            )
            result["ready_seconds"] = time.monotonic() - ready
            result["evidence"] = provider_evidence(svc)
            result["points"] = service_points(svc, artifacts, device, seconds, work)
            cpu = stack.enter_context(service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu"))
            servers = {"service": svc, "cpu": cpu}
            ready_seconds = {}
            for name, env in VARIANTS.items() if result["evidence"]["models"][HEAVY]["provider"] == CUDA else ():
                ready = time.monotonic()
                db = f"sqlite:///{work / f'{len(servers)}.db'}"
                servers[name] = stack.enter_context(service(artifacts, db, False, device, **env))
                ready_seconds[name] = time.monotonic() - ready
            result["parity"] = parity({name: server.url for name, server in servers.items()}, "cpu")
            result["variants"] = [
                variant_load(name, servers[name], seconds, work) | {"ready_seconds": ready_seconds[name]}
                for name in ready_seconds
            ]
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


POINT_COLUMNS = (
    "model protocol rows_per_s batch raw_rows_per_s vs_raw p50_1_client_ms p99_1_client_ms queue_ms inference_ms "
    "parse_ms encode_ms total_ms non_2xx"
)


def run_report(result: dict) -> str:
    """The run as markdown: the device, the points, parity, the profile, CUDA unavailable, the goals."""
    d, cpu, hidden = result["device"], result["device"]["machine"], result["cuda_unavailable"]
    keys = ("gpu", "driver", "driver_cuda", "cuda_runtime", "cudnn", "onnxruntime")
    device = ", ".join(f"{k} {d.get(k)}" for k in keys if d.get(k) is not None)
    providers = {m: v["provider"] for m, v in result["evidence"]["models"].items()}
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
        "\n### Raw single-row inference\n"
        + table([{"model": m} | v for m, v in result["single_row"].items()], "model provider calls p50_ms p99_ms"),
        "\n### Probabilities against the CPU path\n"
        + table(result["parity"], "model server against rows max_abs_diff argmax_agree"),
    ]
    if result["variants"]:
        lines.append(
            "\n### Other CUDA settings, heavy model at 64 clients\n"
            + table(result["variants"], "variant json_rows_per_s binary_rows_per_s json_p50_1_client_ms ready_seconds")
        )
    lines += [
        "\n### onnxruntime profile, heavy model at the formed batch (ms per run)\n"
        + table([result["profile"]], "provider batch runs model_run_ms node_kernels_ms memcpy_ms top_ops"),
        f"\n### CUDA asked for where it cannot run (GPUs hidden)\n{hidden_text}",
        "\n### Goals\n" + table(result["goals"], "goal measured target met"),
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
