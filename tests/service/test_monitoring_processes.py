"""Monitoring across processes: shared PostgreSQL, restarts, SIGKILL, and a database outage."""

import itertools
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from training.data import load_digits_splits

DIGITS = load_digits_splits().test
pytestmark = pytest.mark.e2e  # server processes (python -m service), some on PostgreSQL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """``python -m service`` in a subprocess, as docker-compose runs it (same flags and variables)."""

    def __init__(self, artifacts, database_url, **env):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = dict(os.environ, CALIB_DATABASE_URL=database_url, CALIB_DEFAULT_MODEL="digits-lenet5",
                           CALIB_BOOTSTRAP_RESAMPLES="300", CALIB_EVALUATE_SECONDS="0.2")
        environment.update(env)
        self.process = subprocess.Popen([sys.executable, "-m", "service", "--artifacts", str(artifacts),
                                         "--port", str(self.port)], env=environment,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(self.process.communicate()[0])

    def stop(self, sig=signal.SIGTERM):
        self.process.send_signal(sig)
        return self.process.communicate(timeout=30)[0]


def _evaluation_passes(url) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("calib_evaluation_duration_seconds_count"))


def _evaluated(*replicas, timeout=60.0) -> None:
    """Wait until every replica has completed two more alarm evaluation passes: the second began after
    everything acknowledged so far was committed (the first may have begun before)."""
    targets = [(r, _evaluation_passes(r.url) + 2) for r in replicas]
    deadline = time.monotonic() + timeout
    for replica, target in targets:
        while _evaluation_passes(replica.url) < target:
            assert time.monotonic() < deadline, "no alarm evaluation"
            time.sleep(0.05)


def _offline_items(n, seed, scale=1.0):
    z, y = calibrated_logits(n, n_classes=10, logit_scale=8.0, seed=seed)
    return [{"probabilities": p.tolist(), "label": int(t)} for p, t in zip(softmax(scale * z), y)]


def test_two_replicas_sharing_postgresql_report_the_same_calibration(repository_dir, pg_url):
    a, b = Replica(repository_dir, pg_url), Replica(repository_dir, pg_url)
    try:
        body = httpx.post(f"{a.url}/predict", json={"inputs": DIGITS.x[:60].tolist()}).json()
        time.sleep(1.5)  # replica a writes its prediction log every 0.5 s
        items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(body["predictions"], DIGITS.y[:60])]
        assert httpx.post(f"{b.url}/feedback", json={"items": items}).json()["accepted"] == 60
        assert httpx.post(f"{a.url}/feedback", json={"items": _offline_items(300, 1)}).json()["accepted"] == 300
        assert httpx.post(f"{b.url}/feedback", json={"items": _offline_items(300, 2, 2.5)}).json()["accepted"] == 300
        _evaluated(a, b)
        for window in ("500", "1000", "1h"):
            report_a = httpx.get(f"{a.url}/calibration", params={"window": window}).json()
            report_b = httpx.get(f"{b.url}/calibration", params={"window": window}).json()
            assert report_a == report_b
        assert report_a["n"] == 660
    finally:
        a.stop()
        b.stop()


def test_restart_keeps_everything_and_sigkill_loses_no_acknowledged_feedback(repository_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    first = Replica(repository_dir, url)
    body = httpx.post(f"{first.url}/predict", json={"inputs": DIGITS.x[:40].tolist()}).json()
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(body["predictions"], DIGITS.y[:40])]
    assert httpx.post(f"{first.url}/feedback", json={"items": items}).json()["accepted"] == 40
    _evaluated(first)
    before = httpx.get(f"{first.url}/calibration", params={"window": "1000"}).json()
    first.stop()
    second = Replica(repository_dir, url)
    after = httpx.get(f"{second.url}/calibration", params={"window": "1000"}).json()
    assert after == before and after["n"] == 40

    # single-label requests from 32 clients at once (they are group-committed) next to batches of 25
    # offline items, until the process is killed mid-load
    rows = np.resize(DIGITS.x, (4000, *DIGITS.x.shape[1:]))
    ids = [p["id"] for start in range(0, 4000, 1000) for p in httpx.post(
        f"{second.url}/predict", json={"inputs": rows[start:start + 1000].tolist()}, timeout=60).json()["predictions"]]
    unlabelled = iter(ids)
    acknowledged, sent, acknowledged_ids, sent_ids = [], [], [], []
    lock = threading.Lock()

    def send(seed):
        batch = _offline_items(25, 100 + seed)
        sent.append(len(batch))
        try:
            r = httpx.post(f"{second.url}/feedback", json={"items": batch}, timeout=10)
            if r.status_code == 200:
                acknowledged.append(r.json()["accepted"])
        except httpx.TransportError:
            pass

    def label_one_at_a_time():
        with httpx.Client(base_url=second.url, timeout=10) as client:
            while True:
                with lock:
                    prediction_id = next(unlabelled, None)
                if prediction_id is None:
                    return
                sent_ids.append(prediction_id)
                try:
                    r = client.post("/feedback", json={"items": [{"prediction_id": prediction_id, "label": 1}]})
                except httpx.TransportError:
                    return
                if r.status_code == 200 and r.json()["accepted"] == 1:
                    acknowledged_ids.append(prediction_id)

    with ThreadPoolExecutor(36) as pool:
        singles = [pool.submit(label_one_at_a_time) for _ in range(32)]
        futures = [pool.submit(send, s) for s in range(400)]
        deadline = time.monotonic() + 60
        while not acknowledged or len(acknowledged_ids) < 200:
            assert time.monotonic() < deadline, (len(acknowledged), len(acknowledged_ids))
            time.sleep(0.01)
        second.stop(signal.SIGKILL)
        for f in itertools.chain(singles, futures):
            f.result()
    assert second.process.returncode == -signal.SIGKILL and 0 < len(acknowledged) < 400
    assert 200 <= len(acknowledged_ids) < len(ids)
    third = Replica(repository_dir, url)
    try:
        stored = httpx.get(f"{third.url}/calibration", params={"window": "100000"}).json()["n"]
    finally:
        third.stop()
    assert 40 + sum(acknowledged) + len(acknowledged_ids) <= stored <= 40 + sum(sent) + len(sent_ids)
    with sqlite3.connect(tmp_path / "store.db") as db:
        labelled = {prediction_id for (prediction_id,) in db.execute("SELECT prediction_id FROM labels")}
    assert set(acknowledged_ids) <= labelled


def test_database_outage_degrades_and_recovers(repository_dir, pg_url, cuttable_proxy):
    proxy = cuttable_proxy
    replica = Replica(repository_dir, pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"))
    try:
        assert httpx.post(f"{replica.url}/feedback", json={"items": _offline_items(5, 1)}).json()["accepted"] == 5
        proxy.cut()
        during = httpx.post(f"{replica.url}/predict", json={"inputs": DIGITS.x[:3].tolist()})
        assert during.status_code == 200
        refused = httpx.post(f"{replica.url}/feedback", json={"items": _offline_items(5, 2)})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "storage_unavailable"
        health = httpx.get(f"{replica.url}/health").json()
        assert health["status"] == "degraded" and health["storage"]["up"] is False and health["ready"]
        assert health["storage"]["prediction_log_pending"] == 3
        assert "calib_storage_up 0.0" in httpx.get(f"{replica.url}/metrics").text
        assert httpx.get(f"{replica.url}/calibration").status_code == 503
        proxy.restore()
        deadline = time.monotonic() + 20
        while httpx.get(f"{replica.url}/health").json()["storage"]["up"] is False:
            assert time.monotonic() < deadline, "the service did not recover"
            time.sleep(0.2)
        # predictions made during the outage were kept and written: their feedback is accepted now
        items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(during.json()["predictions"], DIGITS.y[:3])]
        recovered = httpx.post(f"{replica.url}/feedback", json={"items": items}).json()
        assert recovered["accepted"] == 3, recovered
        assert httpx.get(f"{replica.url}/calibration").json()["n"] == 8
        assert httpx.get(f"{replica.url}/health").json()["status"] == "ok"
    finally:
        replica.stop()
