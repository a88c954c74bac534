"""The engine at the device's limit (issue 65, ``python -m bench.gpu --engine --before DIR``): this tree's pod beside
the source tree ``DIR``'s in one run, since repeat runs of one configuration move by more than the changes measured.

One W, the heavy model over binary v2 at 128 single-row clients on each pod in turn (``new again`` shows the drift),
the light model, one heavy client and both models' probabilities; then onnxruntime alone at each batch and bucket
(and with CUDA graphs). From the engine's per-batch timeline (``CALIB_POD__TIMELINE``): time per batch against
onnxruntime alone, the sessions' busy share, and their idle time split into "no work" and "waiting" (rows queued: the
GIL or the lock).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.common import HEAVY, LIGHT, ROOT, service, table, warm
from bench.gpu.device import MODELS, call_ms, device_report, served, single_row_latency
from bench.gpu.pod import against_cpu, drive, padded_to, point, stages, versus_raw
from bench.serving.harness import SHAPES

if TYPE_CHECKING:
    from service.settings import Device

LIMIT_CLIENTS = 128
LIMIT_COLUMNS = (
    "pod model clients requests_per_s batch vs_raw vs_padded engine_vs_bucket sessions_busy idle_no_work "
    "idle_waiting p50_ms errors"
)
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
#: The pods each reported by its heavy rows/s against the first pod's, in the same run.
REPORTED = {
    "rows/s, graphs / no graphs": "graphs",
    "rows/s, front-end window up to 8 / up to 2": "window 8",
    "drift: new again / new": "new again",
}


def timeline(path: Path, start: float, end: float) -> dict:
    """The engine's heavy batches taken within [start, end] (``time.perf_counter``, shared by the processes): per
    bucket, count and mean ms from take to answer, busy share, and idle time by what was queued."""
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
    """One pod from ``tree``: heavy and light under load, one heavy client, its health and its probabilities."""
    line = work / f"{label.replace(' ', '-')}.timeline"
    extra: dict[str, str] = {"CALIB_FRONTENDS": str(w), **env}
    if tree == ROOT:  # a tree from before the timeline would refuse the setting
        extra["CALIB_POD__TIMELINE"] = str(line)
    db = f"sqlite:///{work / (label.replace(' ', '-') + '.db')}"
    with service(artifacts, db, True, device, None, "/v2/health/ready", tree, (), **extra) as svc:
        health = svc.get("/health").json()
        probabilities = {m: served(svc.url, m) for m in MODELS}
        points = []
        for model in MODELS:
            warm(drive, [svc], model, "binary", LIMIT_CLIENTS, 1.0, work, w)  # the batch sizes this load forms
            started = time.perf_counter()
            row = {"pod": label} | point([svc], model, "binary", LIMIT_CLIENTS, seconds, work, w)
            if model == HEAVY:
                time.sleep(0.5)  # the last batches' timeline lines are written once their replies are sent
                row |= timeline(line, started, started + seconds)
            points.append(row)
            print(table([row], LIMIT_COLUMNS), flush=True)
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
        out[str(batch)] = float(np.mean(call_ms(runtime.run, x, 0.5, warm=1)))
    return out


def run_limit(out: Path, device: Device, artifacts: Path, seconds: float, before: Path, w: int) -> dict:
    """The engine at the limit of the module docstring, every stage, the JSON saved after each."""
    result: dict = {"device_asked": device, "frontends": w, "seconds_per_point": seconds, "points": [], "health": {}}
    probabilities: dict[str, dict[str, np.ndarray]] = {}
    pods = [
        ("new", ROOT, {}),
        ("before", before.resolve(), {}),
        ("graphs", ROOT, {"CALIB_RUNTIME__CUDA_GRAPHS": "true"}),
        ("window 8", ROOT, {"CALIB_POD__MAX_WINDOW": "8"}),
        ("new again", ROOT, {}),
    ]
    with stages(out, "limit", result, limit_report) as (work, save):
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
        heavy = [p for p in result["points"] if p["model"] == HEAVY and p["clients"] == LIMIT_CLIENTS and p["batch"]]
        model = artifacts / HEAVY / "1" / "model.onnx"
        ran = tuple(int(b) for p in heavy for b in p.get("engine_ms_by_bucket", {}))  # every bucket the engine ran
        raw = versus_raw(heavy, model, HEAVY, device, ran)
        result["raw"] = {b: r["rows_per_s"] for b, r in raw.items()}
        result["raw_ms"] = {b: r["ms_per_call"] for b, r in raw.items()}
        result["graphs_runtime_ms"] = graph_runtime_ms(model, device, sorted({padded_to(p["batch"]) for p in heavy}))
        for row in heavy:
            if spans := row.get("engine_ms_by_bucket"):  # weighted by the batches run at each bucket
                n = sum(c for c, _ in spans.values())
                row["engine_vs_bucket"] = sum(c * ms / result["raw_ms"][b] for b, (c, ms) in spans.items()) / n
        save("onnxruntime alone")
        result["parity"] = against_cpu(artifacts, work, probabilities, "pod")
        if "graphs" in probabilities:
            result["graphs_vs_no_graphs"] = max(
                float(np.abs(probabilities["graphs"][m] - probabilities["new"][m]).max()) for m in MODELS
            )
        result["goals"] = limit_goals(result)
        save("parity and goals")
    return result


def limit_goals(result: dict) -> list[dict]:
    """The issue's table from one run: each goal on the ``new`` pod (ratios to ``before`` and ``graphs``) and target."""

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
    for goal, pod in REPORTED.items():
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
        lines.append("\n### onnxruntime alone\n" + table(raw, "batch rows_per_s ms_per_call"))
        lines.append(f"\nWith CUDA graphs (the service's runtime, ms per call): {result.get('graphs_runtime_ms')}")
    if result.get("parity"):
        lines.append("\n### Against the CPU path\n" + table(result["parity"], "pod model max_abs_diff"))
    if result.get("goals"):
        lines.append("\n### Goals\n" + table(result["goals"], "goal measured target met"))
    return "\n".join(lines) + "\n"
