"""Serving benchmark: raw onnxruntime, the service and the no-batching baseline, side by side.

Two models: the default light one (LeNet-5 on 8x8 digits, where HTTP dominates) and a heavy one
(an untrained CIFAR ResNet-56 on 32x32x3, where inference dominates). For each: onnxruntime alone
(same providers and thread settings as the service) at batch sizes 1..512; then closed-loop load
with wrk on loopback (1, 4, 16, 64 clients; single-row and 32-row requests) against the service
(prediction logging to SQLite) and against the baseline; then logging off / SQLite / PostgreSQL at
64 clients. Goals are computed as ratios within this one run. Prints tables, writes JSON.

    python bench/serving.py [--seconds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import PYTHON, ROOT, Server, server_histogram_means, table, write_result, wrk

LIGHT, HEAVY = "digits-lenet5", "cifar-resnet56"
BATCH_SIZES = (1, 8, 32, 128, 512)


def heavy_artifact(root: Path) -> None:
    """An untrained CIFAR ResNet-56 exported like any trained model (weights do not change speed)."""
    from calibkit.calibrators import TemperatureScaling
    from training.data import DataSplits, ImageDataset
    from training.evaluation import before_after
    from training.export import write_artifact
    from training.inference import predict_logits
    from training.trainer import ModelSpec

    rng = np.random.default_rng(0)
    names = tuple(f"class{i}" for i in range(10))
    part = lambda n: ImageDataset(rng.random((n, 3, 32, 32), dtype=np.float32), np.arange(n) % 10, names)  # noqa: E731
    splits = DataSplits(part(64), part(64), part(64), "random-cifar")
    model = ModelSpec.for_data("resnet56", splits).build().eval()
    logits = predict_logits(model, splits.val.x)
    calibrator = TemperatureScaling().fit(logits, splits.val.y)
    evaluation = {"validation": before_after(logits, splits.val.y, calibrator, 20, 15)}
    write_artifact(model=model, calibrator=calibrator, class_names=names, input_shape=(3, 32, 32),
                   val_x=splits.val.x, val_y=splits.val.y, evaluation=evaluation, training_info=None,
                   root=root, name=HEAVY, version="1")


def raw_onnxruntime(path: Path, shape: tuple, seconds: float) -> list[dict]:
    from service.runtime import create_runtime
    from service.settings import Settings

    runtime = create_runtime(path, Settings())
    rows = []
    for batch in BATCH_SIZES:
        x = np.random.default_rng(0).random((batch, *shape), dtype=np.float32)
        runtime.run(x)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            runtime.run(x)
            n += 1
        elapsed = time.perf_counter() - start
        rows.append({"batch": batch, "rows_per_s": n * batch / elapsed, "ms_per_call": 1000 * elapsed / n})
    return rows


def body(model: str | None, shape: tuple, rows: int) -> str:
    x = np.random.default_rng(1).random((rows, *shape)).round(3).tolist()
    return json.dumps({"inputs": x} | ({"model": model} if model else {}))


def run_load(url: str, payload: str, connections: int, seconds: float, rows: int) -> dict:
    wrk(url, payload, connections, max(1.0, seconds / 5))  # warm-up, discarded
    result = wrk(url, payload, connections, seconds)
    return result | {"rows_per_s": result["requests_per_s"] * rows}


def service(artifacts: Path, database_url: str, log: bool) -> Server:
    env = {"CALIB_ARTIFACTS": str(artifacts), "CALIB_DATABASE_URL": database_url, "CALIB_LOG_LEVEL": "warning",
           "CALIB_PREDICTION_LOG": "true" if log else "false", "CALIB_DEFAULT_MODEL": LIGHT}
    return Server([PYTHON, "-m", "service"], "/v2/health/ready", env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per load point")
    parser.add_argument("--smoke", action="store_true", help="one short point per case (CI: the script runs)")
    args = parser.parse_args()
    seconds = 1.0 if args.smoke else args.seconds
    concurrency = (4,) if args.smoke else (1, 4, 16, 64)
    request_rows = (1,) if args.smoke else (1, 32)
    stores = (("off", False), ("sqlite", True)) if args.smoke else (("off", False), ("sqlite", True),
                                                                      ("postgresql", True))
    work = Path(tempfile.mkdtemp(prefix="calib-bench-"))
    artifacts = work / "artifacts"
    shutil.copytree(ROOT / "artifacts" / LIGHT / "1", artifacts / LIGHT / "1")
    heavy_artifact(artifacts)
    shapes = {LIGHT: (1, 8, 8), HEAVY: (3, 32, 32)}
    result = {"seconds_per_point": seconds, "raw": {}, "load": [], "logging": [], "split": {}}
    try:
        for model, shape in shapes.items():
            result["raw"][model] = raw_onnxruntime(artifacts / model / "1" / "model.onnx", shape,
                                                   0.3 if args.smoke else 2.0)
            print(f"\nonnxruntime alone, {model}\n" + table(result["raw"][model], ["batch", "rows_per_s", "ms_per_call"]))

        sqlite_url = f"sqlite:///{work / 'bench.db'}"
        svc = service(artifacts, sqlite_url, log=True)
        try:
            for model, shape in shapes.items():
                for rows in request_rows:
                    for c in concurrency:
                        point = run_load(f"{svc.url}/predict", body(model, shape, rows), c, seconds, rows)
                        result["load"].append({"server": "service", "model": model, "rows": rows, "clients": c} | point)
                means = server_histogram_means(svc.url)
                result["split"][model] = means
            result["service_rss_mib"] = svc.rss_mib()
        finally:
            svc.stop()
        for model, shape in shapes.items():
            baseline = Server([PYTHON, str(ROOT / "bench" / "baseline_app.py"), "--model",
                               str(artifacts / model / "1" / "model.onnx")], "/health")
            try:
                for rows in request_rows:
                    for c in concurrency:
                        point = run_load(f"{baseline.url}/predict", body(None, shape, rows), c, seconds, rows)
                        result["load"].append({"server": "baseline", "model": model, "rows": rows, "clients": c} | point)
            finally:
                baseline.stop()
        urls = {"off": sqlite_url, "sqlite": sqlite_url, "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test"}
        for store, log in stores:
            svc = service(artifacts, urls[store], log)
            try:
                for model, shape in shapes.items():
                    point = run_load(f"{svc.url}/predict", body(model, shape, 1), concurrency[-1], seconds, 1)
                    result["logging"].append({"logging": store, "model": model, "clients": concurrency[-1]} | point)
            finally:
                svc.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["goals"] = goals(result, concurrency[-1])
    print("\nclosed-loop load (wrk, loopback)\n" + table(result["load"], ["server", "model", "rows", "clients",
                                                                          "requests_per_s", "rows_per_s", "p50_ms", "p99_ms", "non_2xx"]))
    print("\nprediction logging\n" + table(result["logging"], ["logging", "model", "clients", "rows_per_s", "p50_ms", "p99_ms"]))
    print("\ngoals (ratios within this run)\n" + table(result["goals"], ["goal", "measured", "target", "met"]))
    write_result("serving", result, smoke=args.smoke)


def _find(records, **match):
    return next(r for r in records if all(r[k] == v for k, v in match.items()))


def goals(result: dict, top: int) -> list[dict]:
    """Every goal whose measurements this run made (a smoke run makes only some)."""
    out = []
    for goal in (_batching_goals, _latency_goal, _logging_goals):
        try:
            out += goal(result, top)
        except StopIteration:
            continue
    for row in out:
        value, target = row["measured"], row["target"]
        bound = float(target.split()[1])
        row["met"] = value >= bound if target.startswith(">=") else value <= bound
    return out


def _batching_goals(result: dict, top: int) -> list[dict]:
    load, out = result["load"], []
    heavy_svc = _find(load, server="service", model=HEAVY, rows=1, clients=top)
    heavy_base = _find(load, server="baseline", model=HEAVY, rows=1, clients=top)
    raw = result["raw"][HEAVY]
    best_raw = max(r["rows_per_s"] for r in raw if r["batch"] <= 64) if raw else float("nan")
    out.append({"goal": f"heavy: service rows/s at {top} single-row clients / raw onnxruntime (best batch <= 64)",
                "measured": heavy_svc["rows_per_s"] / best_raw, "target": ">= 0.70"})
    out.append({"goal": f"heavy: service / no-batching baseline at {top} clients",
                "measured": heavy_svc["rows_per_s"] / heavy_base["rows_per_s"], "target": ">= 3"})
    light_svc = _find(load, server="service", model=LIGHT, rows=1, clients=top)
    light_base = _find(load, server="baseline", model=LIGHT, rows=1, clients=top)
    out.append({"goal": f"light: service requests/s / baseline at {top} clients",
                "measured": light_svc["requests_per_s"] / light_base["requests_per_s"], "target": ">= 1.5"})
    return out


def _latency_goal(result: dict, top: int) -> list[dict]:
    single = _find(result["load"], server="service", model=LIGHT, rows=1, clients=1)
    raw_single = _find(result["raw"][LIGHT], batch=1)["ms_per_call"]
    return [{"goal": "light: p50 at 1 client minus raw single-row inference (ms)",
             "measured": single["p50_ms"] - raw_single, "target": "<= 1.5"}]


def _logging_goals(result: dict, top: int) -> list[dict]:
    logging = {(r["logging"], r["model"]): r["rows_per_s"] for r in result["logging"]}
    return [{"goal": f"{model}: throughput cost of prediction logging to {store}",
             "measured": 1 - logging[(store, model)] / logging[("off", model)], "target": "<= 0.10"}
            for model in (LIGHT, HEAVY) for store in ("sqlite", "postgresql") if (store, model) in logging]


if __name__ == "__main__":
    main()
