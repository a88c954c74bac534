"""A recorded stream of served traffic and its labels, and what GET /calibration answered at its end.

``python tests/service/store/recorded_stream.py OUT`` runs a service over a fresh SQLite store with the code on
the path: 600 digits sent to /predict in requests of 50 rows, then labels for 480 of them, sent late, shuffled and
in batches of 40, with an evaluation pass after the predictions and one after the labels. It writes to ``OUT``
the store (``store.db``), the stream (``stream.json``: the prediction ids in the order served, the label batches)
and the answer (``calibration.json``). Run with the code of schema version 2 on the path, it recorded
``tests/service/store/recorded/``, which the compact log's reports are compared against
(``test_recorded_stream.py``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import loopback

ROOT = Path(__file__).resolve().parents[3]
MODEL = "digits-lenet5"
ROWS, REQUEST_ROWS, LABELLED, LABEL_BATCH = 600, 50, 480, 40


def settings(artifacts: Path, url: str):
    """The service's settings: evaluations only when asked, the label-shift alarm folding at once."""
    from service.settings import Settings

    return Settings(
        artifacts=artifacts,
        default_model=MODEL,
        store={"url": url},
        monitoring={"drift_rows": 1000, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        shift={"settle_seconds": 0, "alarm_threshold": 1e6, "check_labels": 100, "prior_resamples": 100},
    )


def evaluate(app) -> None:
    """One evaluation pass now (the evaluator runs on the server's loop)."""
    evaluator = app.state.parts.evaluator
    asyncio.run_coroutine_threadsafe(evaluator.run_once(), evaluator.loop).result(120)


def send_labels(base: str, batches: list[list[dict]]) -> None:
    for items in batches:
        body = loopback.post(f"{base}/feedback", json={"items": items}, timeout=60).json()
        assert body["accepted"] == len(items), body


def calibration(base: str) -> dict:
    return loopback.get(f"{base}/calibration", timeout=60).json()


def record(out: Path) -> None:
    from tests.service.conftest import running_server
    from training.data import load_digits_splits

    out.mkdir(parents=True, exist_ok=True)
    test = load_digits_splits().test
    rng = np.random.default_rng(64)
    rows = rng.choice(len(test.y), ROWS)
    config = settings(ROOT / "artifacts", f"sqlite:///{out / 'store.db'}")
    with running_server(config) as (base, app):
        ids: list[str] = []
        for start in range(0, ROWS, REQUEST_ROWS):
            body = {"inputs": test.x[rows[start : start + REQUEST_ROWS]].tolist()}
            ids += [p["id"] for p in loopback.post(f"{base}/predict", json=body, timeout=60).json()["predictions"]]
        deadline = time.monotonic() + 30
        while calibration(base)["drift"]["recent_predictions"] < ROWS:  # the prediction log has written them all
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        evaluate(app)
        chosen = rng.permutation(ROWS)[:LABELLED]
        batches = [
            [{"prediction_id": ids[i], "label": int(test.y[rows[i]])} for i in chosen[start : start + LABEL_BATCH]]
            for start in range(0, LABELLED, LABEL_BATCH)
        ]
        send_labels(base, batches)
        evaluate(app)
        answer = calibration(base)
    (out / "stream.json").write_text(json.dumps({"ids": ids, "label_batches": batches}))
    (out / "calibration.json").write_text(json.dumps(answer, indent=1, sort_keys=True))
    for suffix in ("-wal", "-shm"):  # checkpointed into store.db by the last connection's close
        (out / f"store.db{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":
    target = Path(sys.argv[1])
    shutil.rmtree(target, ignore_errors=True)
    record(target)
