"""The serving benchmark's monitoring measurements on its soak server: POST /feedback throughput and GET /calibration
latency over many labelled predictions written straight into the store (``fill_store``)."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np

from calibkit import binning
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

MODEL = "digits-lenet5"
CALIBRATION_COLUMNS = "window labels_arriving p50_ms p99_ms requests".split()


def fill_store(url: str, rows: int, chunk: int = 50_000) -> float:
    """Write ``rows`` labelled predictions of the default model directly; returns seconds taken."""
    from service.store import Store
    from service.store.rows import LabelRow, PredictionRow, encode_rows, prediction_ids

    storage = Store(url)
    storage.db.migrate()
    edges = binning.equal_width_edges(15)
    start = time.perf_counter()
    for offset in range(0, rows, chunk):
        n = min(chunk, rows - offset)
        z, y = calibrated_logits(n, logit_scale=8.0, seed=offset)
        p = softmax(z)
        pred = p.argmax(1)
        conf = p[np.arange(n), pred]
        nll = -np.log(np.maximum(p[np.arange(n), y], 1e-15))
        brier = ((p - np.eye(p.shape[1])[y]) ** 2).sum(1)
        probs, logits = encode_rows(p), encode_rows(z)
        now = time.time()
        bins = binning.bin_index(conf, edges)
        columns = zip(prediction_ids(n), *(a.tolist() for a in (pred, conf, y, bins, nll, brier)), probs, logits)
        predictions, labels = [], []
        for id_, k, c, t, b, nl, br, pb, lb in columns:
            predictions.append(PredictionRow(id_, MODEL, "1", 0, now, k, c, c, pb, lb))
            labels.append(LabelRow(id_, MODEL, "1", 0, t, int(k == t), c, b, nl, br, now, pb, lb))
        storage.labels.insert(labels, predictions)
    storage.db.engine.dispose()
    return time.perf_counter() - start


def offline_items(n: int, seed: int) -> list[dict]:
    """``n`` feedback items with probabilities scored elsewhere (each stores a prediction and a label)."""
    z, y = calibrated_logits(n, logit_scale=8.0, seed=seed)
    return [{"probabilities": q.round(6).tolist(), "label": int(t), "model": MODEL} for q, t in zip(softmax(z), y)]


def feedback_throughput(base: str, seconds: float, batch: int) -> dict:
    payload = json.dumps({"items": offline_items(batch, seed=1)})
    with httpx.Client(base_url=base, timeout=600) as client:
        client.post("/feedback", content=payload, headers={"content-type": "application/json"}).raise_for_status()
    sent, start = 0, time.perf_counter()
    with httpx.Client(base_url=base, timeout=60) as client:
        while time.perf_counter() - start < seconds:
            r = client.post("/feedback", content=payload, headers={"content-type": "application/json"})
            r.raise_for_status()
            sent += r.json()["accepted"]
    return {"batch": batch, "labels_per_s": sent / (time.perf_counter() - start), "labels": sent}


def calibration_latency(base: str, windows: list[int], repeats: int) -> list[dict]:
    """GET /calibration latency per window, on a quiet store (repeated reports of the same labels) and
    while labels arrive (one new label before every request, so nothing computed before is reused)."""
    items = offline_items(repeats, seed=2)
    rows = []
    with httpx.Client(base_url=base, timeout=120) as client:
        for window in windows:
            for arriving in (False, True):
                client.get("/calibration", params={"window": str(window)}).raise_for_status()
                times = []
                for item in items:
                    if arriving:
                        client.post("/feedback", json={"items": [item]}).raise_for_status()
                    start = time.perf_counter()
                    client.get("/calibration", params={"window": str(window)}).raise_for_status()
                    times.append(1000 * (time.perf_counter() - start))
                rows.append(
                    {
                        "window": window,
                        "labels_arriving": arriving,
                        "p50_ms": float(np.percentile(times, 50)),
                        "p99_ms": float(np.percentile(times, 99)),
                        "requests": repeats,
                    }
                )
    return rows
