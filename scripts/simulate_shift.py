"""Simulate labelled traffic through the real HTTP API and measure the miscalibration alarm.

Starts ``python -m service`` (as docker-compose does) on a copy of the default artifact, one model version per
scenario so that each has its own monitoring state, then:
- false alarms: ``--runs`` streams of ``--labels`` in-distribution digits (predict, then feedback with the true
  labels); counts runs with any alarm;
- detection: per shift scenario, ``--warmup`` in-distribution labels then shifted ones until the alarm is raised (or
  ``--max-shifted``): corruptions at severities 1..5 go through /predict and /feedback; over-confident logits (scaled
  by 1.6 and 2.5) through offline feedback, for the digits model and for a calibrated synthetic source of 87%
  accuracy (calibkit.synthetic), whose confidences leave room for over-confidence (the digits model's are near 1).
Prints a markdown table and writes JSON.

    python scripts/simulate_shift.py [--runs 10] [--labels 10000] [--out bench/results/simulate_shift.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

from calibkit import metrics
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import apply_temperature, softmax
from service.ports import free_port
from training.data import available_corruptions, corrupt, load_digits_splits

ROOT = Path(__file__).resolve().parents[1]

ARTIFACT = ROOT / "artifacts" / "digits-lenet5" / "1"
MODEL = "digits-lenet5"
#: Logit spread of the synthetic source: 10 classes, about 87% accuracy, calibrated by construction.
SYNTHETIC_SCALE = 8.0
#: Alarm evaluation cadence of the simulated service, short so that each request's labels are assessed before the
#: next request (``evaluated``).
EVALUATE_SECONDS = "0.1"


def prepare_repository(root: Path, versions: int) -> None:
    """Copies of the default artifact as versions 1..versions (independent monitoring state each)."""
    for v in range(1, versions + 1):
        target = root / MODEL / str(v)
        shutil.copytree(ARTIFACT, target, ignore=shutil.ignore_patterns("plots", "*.md", "metrics.json"))
        manifest = json.loads((target / "manifest.json").read_text())
        manifest["version"] = str(v)
        (target / "manifest.json").write_text(json.dumps(manifest))


@contextlib.contextmanager
def serve(artifacts: Path, database: Path, log: Path | None = None, timeout: float = 60.0, **env: str):
    """``python -m service`` on a free loopback port; yields an httpx client to it (its output in ``log`` if given)."""
    port = free_port()
    env = {
        "CALIB_STORE__URL": f"sqlite:///{database}",
        "CALIB_LOG_LEVEL": "warning",
        "CALIB_GRPC_PORT": "0",
        "CALIB_MONITORING__EVALUATE_SECONDS": EVALUATE_SECONDS,
    } | env
    argv = [sys.executable, "-m", "service", "--artifacts", str(artifacts), "--port", str(port)]
    with open(log, "wb") if log is not None else contextlib.nullcontext(subprocess.DEVNULL) as output:
        process = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=output, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/v2/health/ready").status_code == 200:
                        break
                time.sleep(0.2)
            else:
                status = process.returncode
                raise RuntimeError(
                    "the service did not start" if status is None else f"the service exited with status {status}"
                )
            yield client
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _evaluation_passes(client: httpx.Client) -> float:
    return next(
        float(line.split()[1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith("calib_evaluation_duration_seconds_count")
    )


def evaluated(client: httpx.Client, timeout: float = 120.0) -> None:
    """Wait for two more alarm evaluation passes: the second began after the feedback so far was stored."""
    target = _evaluation_passes(client) + 2
    deadline = time.monotonic() + timeout
    while _evaluation_passes(client) < target:
        if time.monotonic() > deadline:
            raise RuntimeError("the service evaluated no alarm")
        time.sleep(0.1)  # each poll renders every metric


def _states(client: httpx.Client, version: str) -> list[str]:
    """The states the model version's alarm moved to, from GET /calibration/history."""
    events = client.get("/calibration/history", params={"model": MODEL, "version": version}).json()["alarm_events"]
    return [e["to"] for e in events]


def _alarmed(client: httpx.Client, version: str) -> bool:
    return "alarm" in _states(client, version)


def send_images(client, version: str, x: np.ndarray, y: np.ndarray) -> None:
    body = client.post("/predict", json={"model": MODEL, "version": version, "inputs": x.tolist()}).json()
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(body["predictions"], y)]
    client.post("/feedback", json={"items": items}).raise_for_status()
    evaluated(client)


def send_offline(client, version: str, probs: np.ndarray, y: np.ndarray) -> None:
    items = [
        {"probabilities": p.tolist(), "label": int(t), "model": MODEL, "version": version} for p, t in zip(probs, y)
    ]
    client.post("/feedback", json={"items": items}).raise_for_status()
    evaluated(client)


def run(args) -> dict:
    splits = load_digits_splits()
    x_pool = np.concatenate([splits.val.x, splits.test.x])
    y_pool = np.concatenate([splits.val.y, splits.test.y])
    session = ort.InferenceSession(str(ARTIFACT / "model.onnx"), providers=["CPUExecutionProvider"])
    temperature = json.loads((ARTIFACT / "manifest.json").read_text())["calibration"]["params"]["temperature"]
    rng = np.random.default_rng(args.seed)

    scenarios = [
        ("synthetic, logits x1.6", "synthetic", 1.6, 0),
        ("synthetic, logits x2.5", "synthetic", 2.5, 0),
        ("digits, logits x1.6", "scale", 1.6, 0),
        ("digits, logits x2.5", "scale", 2.5, 0),
    ]
    scenarios += [(f"{c} s{sev}", "corruption", c, sev) for c in args.corruptions for sev in args.severities]
    versions = args.runs + len(scenarios)
    result = {"setup": vars(args) | {"temperature": temperature}, "false_alarm_runs": [], "scenarios": []}
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="calib-sim-")))
        prepare_repository(workdir / "artifacts", versions)
        client = stack.enter_context(serve(workdir / "artifacts", workdir / "store.db"))
        for run_index in range(args.runs):
            version = str(run_index + 1)
            for start in range(0, args.labels, args.batch_in):
                idx = rng.integers(0, len(y_pool), size=min(args.batch_in, args.labels - start))
                send_images(client, version, x_pool[idx], y_pool[idx])
            states = _states(client, version)
            result["false_alarm_runs"].append(
                {"labels": args.labels, "alarm": "alarm" in states, "warnings": states.count("warning")}
            )
            print(f"in-distribution run {run_index + 1}: {args.labels} labels, alarm={'alarm' in states}", flush=True)

        for offset, (name, kind, value, severity) in enumerate(scenarios):
            version = str(args.runs + offset + 1)
            for _ in range(0, args.warmup, args.batch):
                idx = rng.integers(0, len(y_pool), size=args.batch)
                if kind == "synthetic":
                    z, y = calibrated_logits(args.batch, logit_scale=SYNTHETIC_SCALE, seed=int(rng.integers(1 << 30)))
                    send_offline(client, version, softmax(z), y)
                else:
                    send_images(client, version, x_pool[idx], y_pool[idx])
            population = _population_ece(session, temperature, x_pool, y_pool, kind, value, severity)
            needed = None
            for sent in range(args.batch, args.max_shifted + 1, args.batch):
                idx = rng.integers(0, len(y_pool), size=args.batch)
                if kind == "synthetic":
                    z, y = calibrated_logits(args.batch, logit_scale=SYNTHETIC_SCALE, seed=int(rng.integers(1 << 30)))
                    send_offline(client, version, softmax(value * z), y)
                elif kind == "scale":
                    logits = session.run(["logits"], {"input": x_pool[idx]})[0].astype(np.float64)
                    send_offline(client, version, apply_temperature(value * logits, temperature), y_pool[idx])
                else:
                    send_images(
                        client,
                        version,
                        corrupt(x_pool[idx], value, severity, seed=int(rng.integers(1 << 30))),
                        y_pool[idx],
                    )
                if _alarmed(client, version):
                    needed = sent
                    break
            final = client.get("/calibration", params={"model": MODEL, "version": version}).json()
            row = {
                "scenario": name,
                "population_ece": population["ece"],
                "accuracy": population["accuracy"],
                "labels_to_alarm": needed,
                "final_state": final["alarm"]["state"],
                "window_ece": final["ece"],
                "window_ece_ci": final["ece_ci"],
            }
            result["scenarios"].append(row)
            print(
                f"{name}: ECE {population['ece']:.3f} -> alarm after {needed} labels ({final['alarm']['state']})",
                flush=True,
            )
    return result


def _population_ece(session, temperature, x, y, kind, value, severity) -> dict:
    """ECE and accuracy of the shifted stream on the whole evaluation pool (what the alarm should see)."""
    if kind == "synthetic":
        z, y = calibrated_logits(200_000, logit_scale=SYNTHETIC_SCALE, seed=12345)
        probs = softmax(value * z)
    elif kind == "scale":
        probs = apply_temperature(value * session.run(["logits"], {"input": x})[0].astype(np.float64), temperature)
    else:
        probs = session.run(["probabilities"], {"input": corrupt(x, value, severity, seed=0)})[0].astype(np.float64)
    return {"ece": metrics.ece(probs, y), "accuracy": metrics.accuracy(probs, y)}


def markdown(result: dict) -> str:
    runs = result["false_alarm_runs"]
    labels = sum(r["labels"] for r in runs)
    alarms = sum(r["alarm"] for r in runs)
    lines = [
        f"False alarms: {alarms} of {len(runs)} in-distribution streams of {runs[0]['labels'] if runs else 0} "
        f"labels ({labels} labels in all) raised an alarm; the e-detector's mean time to a false alarm is at least "
        f"CALIB_ALARM__THRESHOLD labels (12,500 by default). Warnings (label-free drift signals) in those streams: "
        f"{sum(r['warnings'] for r in runs)}.",
        "",
        "| shift | population ECE | accuracy | labels to alarm after the shift | state |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in result["scenarios"]:
        needed = (
            row["labels_to_alarm"]
            if row["labels_to_alarm"] is not None
            else f"none within {result['setup']['max_shifted']}"
        )
        lines.append(
            f"| {row['scenario']} | {row['population_ece']:.3f} | {row['accuracy']:.3f} | {needed} | "
            f"{row['final_state']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="in-distribution streams for the false-alarm rate")
    parser.add_argument("--labels", type=int, default=10_000, help="labels per in-distribution stream")
    parser.add_argument("--warmup", type=int, default=500, help="in-distribution labels before each shift")
    parser.add_argument("--max-shifted", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=25, help="labels per request during shifts (alarm resolution)")
    parser.add_argument("--batch-in", type=int, default=100, help="labels per request in false-alarm streams")
    parser.add_argument("--corruptions", nargs="*", default=list(available_corruptions()))
    parser.add_argument("--severities", nargs="*", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "simulate_shift.json")
    args = parser.parse_args()
    result = run(args)
    table = markdown(result)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
