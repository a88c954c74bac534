"""Monitoring across processes: shared PostgreSQL, restarts, SIGKILL, and a database outage."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from training.data import load_digits_splits

DIGITS = load_digits_splits().test


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
                           CALIB_BOOTSTRAP_RESAMPLES="300", **env)
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
    before = httpx.get(f"{first.url}/calibration", params={"window": "1000"}).json()
    first.stop()
    second = Replica(repository_dir, url)
    after = httpx.get(f"{second.url}/calibration", params={"window": "1000"}).json()
    assert after == before and after["n"] == 40

    acknowledged, sent = [], []

    def send(seed):
        batch = _offline_items(25, 100 + seed)
        sent.append(len(batch))
        try:
            r = httpx.post(f"{second.url}/feedback", json={"items": batch}, timeout=10)
            if r.status_code == 200:
                acknowledged.append(r.json()["accepted"])
        except httpx.TransportError:
            pass

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(send, s) for s in range(40)]
        while not acknowledged:
            time.sleep(0.01)
        second.stop(signal.SIGKILL)
        for f in futures:
            f.result()
    assert second.process.returncode == -signal.SIGKILL and 0 < len(acknowledged) < 40
    third = Replica(repository_dir, url)
    try:
        stored = httpx.get(f"{third.url}/calibration", params={"window": "100000"}).json()["n"]
    finally:
        third.stop()
    assert 40 + sum(acknowledged) <= stored <= 40 + sum(sent)


class CuttableProxy:
    """A TCP forwarder to PostgreSQL whose link can be cut and restored, to simulate an outage."""

    def __init__(self, target=("127.0.0.1", 5432)):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self):
        self.up = False
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sockets.clear()

    def restore(self):
        self.up = True

    def close(self):
        self.cut()
        self.listener.close()


def test_database_outage_degrades_and_recovers(repository_dir, pg_url):
    proxy = CuttableProxy()
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
        proxy.close()
