"""What the serving measurements share: the two models and their requests, the servers compared with the service,
onnxruntime alone, and the service's own histograms and queues."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.common import HEAVY, LIGHT, PYTHON, ROOT, Server, histogram_means, histogram_totals, v2_binary_request

if TYPE_CHECKING:
    from service.settings import Device

SHAPES = {LIGHT: (1, 8, 8), HEAVY: (3, 32, 32)}
BATCH_SIZES = (1, 8, 32, 128, 512)
CUDA = "CUDAExecutionProvider"
PHASES = ["parse", "validate", "batch", "encode", "total"]


def both_artifacts(work: Path) -> Path:
    """A model repository under ``work`` with the light model and the heavy one (an untrained CIFAR ResNet-56)."""
    from training.untrained import untrained_artifact

    artifacts = work / "artifacts"
    shutil.copytree(ROOT / "artifacts" / LIGHT / "1", artifacts / LIGHT / "1")
    untrained_artifact(artifacts, HEAVY)
    return artifacts


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


def raw_at(model_path: Path, formed: float | None, seconds: float, device: Device, model: str = HEAVY) -> dict:
    """onnxruntime alone (``raw_onnxruntime``) at the whole batch size nearest the mean ``formed`` (1 when none)."""
    return raw_onnxruntime(model_path, SHAPES[model], seconds, (max(1, round(formed or 1.0)),), device)[0]


def body(model: str | None, shape: tuple, rows: int) -> str:
    x = np.random.default_rng(1).random((rows, *shape)).round(3).tolist()
    return json.dumps({"inputs": x} | ({"model": model} if model else {}))


def v2_binary_body(model: str, shape: tuple, rows: int) -> tuple[bytes, int]:
    """``v2_binary_request`` of ``rows`` seeded rows of ``shape``: the body and the header's length."""
    return v2_binary_request(np.random.default_rng(1).random((rows, *shape), dtype=np.float32))


def binary_lua(body_file: Path, header_length: int) -> str:
    """A wrk script that POSTs the binary v2 body in ``body_file``."""
    return (
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/octet-stream"\n'
        f'wrk.headers["Inference-Header-Content-Length"] = "{header_length}"\n'
        f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
    )


def single_row_requests(work: Path, model: str = HEAVY) -> dict[str, tuple[str, str | None, str | None]]:
    """``model``'s single-row request per protocol (JSON /predict, binary v2) as (path, JSON body, wrk script)."""
    binary, header_length = v2_binary_body(model, SHAPES[model], 1)
    (work / f"{model}-v2-binary.bin").write_bytes(binary)
    return {
        "json": ("/predict", body(model, SHAPES[model], 1), None),
        "binary": (f"/v2/models/{model}/infer", None, binary_lua(work / f"{model}-v2-binary.bin", header_length)),
    }


def baseline_server(model_path: Path, device: str) -> Server:
    """The no-batching baseline (bench/serving/baseline_app.py) serving ``model_path`` on ``device``."""
    return Server(
        [PYTHON, "-m", "bench.serving.baseline_app", "--model", str(model_path), "--device", device], "/health"
    )


def floor_server(model_path: Path | None = None) -> Server:
    """The floor app on uvicorn as the service runs it; with ``model_path``, the batching floor serving that model."""
    return Server(
        [PYTHON, "-m", "uvicorn", "bench.serving.floor_app:app", "--no-access-log", "--log-level", "warning"],
        "/",
        {"FLOOR_MODEL": str(model_path)} if model_path else None,
    )


def grpc_target(svc: Server) -> str:
    """The service's gRPC address (its /health names the port)."""
    return f"127.0.0.1:{svc.get('/health').json()['grpc_port']}"


def formed_batch(svc: Server, before: dict, model: str) -> float | None:
    """Mean rows per onnxruntime call of ``model`` since the ``histogram_totals`` snapshot ``before``."""
    return histogram_means(before, histogram_totals(svc.url), [f"batch:{model}"])[f"batch:{model}"]


def summed_totals(servers: list[Server], model: str | None = None) -> dict[str, list[float]]:
    """The per-model ``histogram_totals`` of ``servers`` (``model``'s, or every model's), summed by histogram."""
    out: dict[str, list[float]] = {}
    for svc in servers:
        for key, (total, count) in histogram_totals(svc.url).items():
            name, _, of = key.partition(":")
            if of and of == (model or of):
                summed = out.setdefault(name, [0.0, 0.0])
                summed[0] += total
                summed[1] += count
    return out


def settled(svc: Server, pending: Callable[[dict], object], timeout: float) -> None:
    """Wait until ``pending`` of ``svc``'s /health is false, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pending(svc.get("/health").json()) and time.monotonic() < deadline:
        time.sleep(0.05)


def drained_queue(svc: Server, timeout: float = 120.0) -> None:
    """Wait until no model of ``svc`` has rows queued for its batcher (a closed-loop load's last requests)."""
    settled(svc, lambda health: any(m["queued_rows"] for m in health["models"]), timeout)


def drained(svc: Server, timeout: float = 60.0) -> None:
    """Wait until the prediction log of ``svc`` has written every queued row."""
    settled(svc, lambda health: health["storage"]["prediction_log_pending"], timeout)


def settled_totals(servers: list[Server], model: str, timeout: float = 10.0) -> dict[str, list[float]]:
    """``summed_totals`` once a load's requests in flight have ended (wrk counts only those it saw answered): two reads
    0.1 s apart agree and, in a pod, the engine's batches hold as many rows as the front-ends' messages."""
    last, deadline = summed_totals(servers, model), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = summed_totals(servers, model)
        if now == last and ("message" not in now or now["message"][0] == now.get("batch", [0.0])[0]):
            break
        last = now
    return last
