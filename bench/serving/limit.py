"""The engine at the device's limit (issue 65; ``python -m bench.gpu --engine --before DIR``): this tree's pod against
the pod of the source tree ``DIR`` (today's engine), side by side in one run, because repeat runs of one
configuration move by more than the changes measured.

One W (``--frontends``, its first value) and the heavy model over binary v2 at 128 single-row clients, on these
pods in turn, each started, warmed up for a second and measured for ``--seconds``:

1. ``new``: this tree, with the engine's per-batch timeline on (``CALIB_POD__TIMELINE``);
2. ``before``: the tree ``DIR``;
3. ``graphs``: this tree with ``CALIB_RUNTIME__CUDA_GRAPHS`` (its fallback, if any, is recorded);
4. ``window 8``: this tree with the front-ends' window free to widen up to 8 (``CALIB_POD__MAX_WINDOW``);
5. ``new again``: the first configuration once more, to show the run's drift.

Each pod also serves the light model's single rows (binary, 128 clients), one heavy client alone (p50), and the
probabilities of both models for the parity check. Then onnxruntime alone at every batch formed and every bucket
padded to (and, with graphs, the service's runtime with graphs at those buckets), and the CPU path's probabilities.
From the timeline: the engine's time per batch (taken to answered) against onnxruntime alone at the bucket, and the
share of time its sessions ran, their idle time split into "no work" (nothing queued when the thread came back) and
"waiting" (rows queued: the GIL or the lock). The JSON is written after every stage, ``limit.json`` and
``limit.md`` under ``--out``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from bench.common import ROOT, save_stage, table
from bench.serving.measure import HEAVY, LIGHT, SHAPES, drained_queue, raw_onnxruntime, service
from bench.serving.pod import drive, padded_to, point, served

if TYPE_CHECKING:
    from service.settings import Device

CLIENTS = 128
POINT_COLUMNS = (
    "pod model clients requests_per_s batch vs_raw vs_padded engine_vs_bucket sessions_busy idle_no_work "
    "idle_waiting p50_ms errors"
).split()
#: The issue's targets, by the row's ``goal`` key.
TARGETS = {
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
    svc = service(artifacts, db, True, device, None, "/v2/health/ready", tree, (), **extra)
    try:
        health = httpx.get(f"{svc.url}/health").json()
        probabilities = {m: served(svc.url, m) for m in (HEAVY, LIGHT)}
        points = []
        for model in (HEAVY, LIGHT):
            drive([svc], model, "binary", CLIENTS, 1.0, work, w)  # warm-up: the batch sizes this load forms
            started = time.perf_counter()
            row = {"pod": label} | point([svc], model, "binary", CLIENTS, seconds, work, w)
            if model == HEAVY:
                time.sleep(0.5)  # the last batches' timeline lines are written once their replies are sent
                row |= timeline(line, started, started + seconds)
            points.append(row)
            print(table([row], POINT_COLUMNS), flush=True)
        drained_queue(svc)
        points.append({"pod": label} | point([svc], HEAVY, "binary", 1, 1.0, work, w))
        return points, health, probabilities
    finally:
        svc.stop()


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


def run(out: Path, device: Device, artifacts: Path, seconds: float, before: Path, w: int) -> dict:
    """Every stage of the module docstring, the JSON saved after each."""
    from bench.serving.device import device_report, single_row_latency

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
        heavy = [p for p in result["points"] if p["model"] == HEAVY and p["clients"] == CLIENTS and p.get("batch")]
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
        cpu = service(artifacts, f"sqlite:///{work / 'cpu.db'}", False, "cpu", CALIB_FRONTENDS="1")
        try:
            reference = {m: served(cpu.url, m) for m in (HEAVY, LIGHT)}
        finally:
            cpu.stop()
        result["parity"] = [
            {"pod": label, "model": m, "max_abs_diff": float(np.abs(p[m] - reference[m]).max())}
            for label, p in probabilities.items()
            for m in (HEAVY, LIGHT)
        ]
        if "graphs" in probabilities:
            result["graphs_vs_no_graphs"] = max(
                float(np.abs(probabilities["graphs"][m] - probabilities["new"][m]).max()) for m in (HEAVY, LIGHT)
            )
        result["goals"] = goals(result)
        save("parity and goals")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "limit.md").write_text(report(result))
    return result


def goals(result: dict) -> list[dict]:
    """The issue's table from one run: each goal's measure on the ``new`` pod (its ratios to ``before`` and
    ``graphs`` in the same run), beside its target."""

    def at(pod: str, model: str, clients: int = CLIENTS) -> dict:
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
        sense, target = TARGETS[goal]
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


def report(result: dict) -> str:
    device = result.get("device", {})
    lines = [
        f"## The engine at the device's limit on {device.get('gpu', result['device_asked'])} "
        f"(`python -m bench.gpu --engine --before DIR`), W = {result['frontends']}",
        f"{result.get('minutes', 0):.1f} minutes, {result['seconds_per_point']} s per point; stages: "
        f"{', '.join(result.get('stages_done', []))}",
        "\n### Points\n" + table(result["points"], POINT_COLUMNS),
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
