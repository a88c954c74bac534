"""``python -m service`` as operators run it: flags, serving, and graceful shutdown on SIGTERM."""

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from bench.common import loopback
from service.ports import free_port


def _start(args, env=None):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "service", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if loopback.get(f"{url}/health").status_code in (200, 503):
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(process.stdout.read())


@pytest.mark.e2e  # spawns a server process (python -m service)
def test_sigterm_lets_in_flight_requests_finish(tmp_path, linear_artifact):
    linear_artifact(tmp_path, "toy", "1")
    # a long queue delay keeps the request in flight while the process is asked to stop
    (tmp_path / "toy" / "serving.json").write_text(json.dumps({"max_batch_size": 64, "max_queue_delay_ms": 1500}))
    process, url = _start(["--artifacts", str(tmp_path), "--log-level", "info"])
    result = {}

    def client():
        result["response"] = loopback.post(f"{url}/predict", json={"inputs": [[0.1, 0.2, 0.3, 0.4]]}, timeout=30)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.4)
    process.send_signal(signal.SIGTERM)
    thread.join(timeout=30)
    output, _ = process.communicate(timeout=30)
    assert result["response"].status_code == 200, output
    assert result["response"].json()["predictions"][0]["label"] in {"a", "b", "c"}
    # a replica that drained on SIGTERM exits 0: orchestrators read a death by signal as a failure
    assert process.returncode == 0
    assert "queued and in-flight batches finished" in output


@pytest.mark.e2e  # spawns a server process (python -m service)
def test_serves_the_committed_default_artifact_with_env_settings(tmp_path):
    import os

    env = dict(os.environ, CALIB_DEFAULT_MODEL="digits-lenet5", CALIB_LIMITS__MAX_ROWS_PER_REQUEST="2")
    process, url = _start([], env=env)
    try:
        health = loopback.get(f"{url}/health").json()
        too_many = loopback.post(f"{url}/predict", json={"inputs": [[0.0] * 64] * 3})
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert health["status"] == "ok" and health["models"][0]["name"] == "digits-lenet5"
    assert too_many.status_code == 422 and "at most 2" in too_many.json()["error"]["message"]


def test_bad_flags_fail_fast():
    result = subprocess.run([sys.executable, "-m", "service", "--port", "99999"], capture_output=True, text=True)
    assert result.returncode == 2 and "port" in result.stdout + result.stderr


def test_main_freezes_the_startup_heap_and_sets_the_gc_threshold(monkeypatch):
    import gc

    from service import cli

    served = {}
    monkeypatch.setattr(cli, "GC_THRESHOLD", 12345)

    class Server:
        def __init__(self, config):
            self.config = config

        def run(self, sockets=None):
            served.update(
                threshold=gc.get_threshold(),
                frozen=gc.get_freeze_count(),
                port=self.config.port,
                workers=self.config.workers,
                sockets=sockets,
            )

    monkeypatch.setattr(cli.uvicorn, "Server", Server)
    before = gc.get_threshold()
    try:
        assert cli.main(["--port", "8123"]) == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert served["threshold"] == (12345, *before[1:])
    assert served["frozen"] > 0 and served["port"] == 8123 and served["workers"] == 1 and served["sockets"] is None
