"""A pod (`python -m service` with CALIB_FRONTENDS=2): one engine and two front-ends on one port, answering as one
service: the in-process answers, ids unique and stored, /metrics summed over the processes, tritonclient over
HTTP and gRPC as before; a killed engine answers 503 and is back within a bound; a killed front-end is replaced
while the other serves; SIGTERM drains the pod and it exits 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.common import loopback
from service.serving.runtime import create_runtime
from service.settings import Settings
from tests.waiting import answers, wait_for
from training.data import load_dataset

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"
pytestmark = pytest.mark.e2e  # a pod of processes
#: The bound this test states for a killed engine or front-end to be serving again (start, load, warm-up).
BACK_WITHIN = 45.0
#: The models' deadline in this pod: a request's longest wait, and how long a batch may run before the engine exits.
DEADLINE = 5.0
FAULTS = Path(__file__).resolve().parent / "faults"


def _children(pid: int) -> dict[int, str]:
    """The pod's child processes by pid, named by their command line."""
    pids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(p): Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode() for p in pids}


def _gone(pid: int) -> bool:
    """The process has ended (a zombie not yet reaped by the pod, or reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _listeners(port: int) -> set[str]:
    """The sockets listening on the port (/proc/net/tcp: local address as hex ip:port, state 0A, inode tenth), each
    named as a process's fd links to it."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found


def _sockets(pid: int) -> set[str]:
    """What the process's fds link to (nothing once it has ended)."""
    try:
        return {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    except OSError:
        return set()


def _listening(pid: int, port: int) -> int:
    """How many of the pod's front-ends hold a listening socket on the port: a front-end listens only once its app
    has started, so a pod whose front-end is still starting answers on the others alone."""
    listeners = _listeners(port)
    return sum(
        bool(_sockets(child) & listeners) for child, cmd in _children(pid).items() if "service.engine" not in cmd
    )


def _serves(url: str, x: list, times: int) -> bool:
    for _ in range(times):
        with httpx.Client(base_url=url) as client:
            if client.post("/predict", json={"inputs": x}).status_code != 200:
                return False
    return True


@pytest.fixture(scope="module")
def pod(tmp_path_factory, linear_artifact):
    root = tmp_path_factory.mktemp("pod")
    shutil.copytree(DEFAULT, root / "artifacts" / "digits-lenet5" / "1")
    linear_artifact(root / "artifacts", "tabular", "1", shape=(5,))
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        CALIB_FRONTENDS="2",
        CALIB_STORE__URL=f"sqlite:///{root / 'pod.db'}",
        CALIB_GRPC_PORT="0",
        CALIB_BATCHING__DEADLINE_SECONDS=str(DEADLINE),
        # faults/sitecustomize.py: the engine's onnxruntime calls fail as told by the file POD_TEST_FAULT names
        PYTHONPATH=os.pathsep.join([str(FAULTS), *filter(None, [os.environ.get("PYTHONPATH")])]),
        POD_TEST_FAULT=str(root / "fault"),
    )
    process = subprocess.Popen(
        # flags reach the front-ends and the engine as the settings they stand for
        [sys.executable, "-m", "service", "--port", str(port), "--artifacts", str(root / "artifacts")],
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(f"{url}/v2/health/ready") and _listening(process.pid, port) == 2, 90, "the pod's start")
    yield url, process, root / "pod.db"
    if process.poll() is None:
        process.kill()


def test_the_pod_answers_as_one_in_process_service(pod):
    url, process, db = pod
    assert sorted(name.split()[2] for name in _children(process.pid).values()) == [
        "service",
        "service",
        "service.engine",
    ]
    x = load_dataset("digits").test.x[:64]
    reference = create_runtime(DEFAULT / "model.onnx", Settings(), 1).run(x[:1])["probabilities"]
    alone = loopback.post(f"{url}/predict", json={"inputs": x[:1].tolist()}).json()["predictions"][0]
    np.testing.assert_array_equal(np.array(alone["probabilities"], np.float32), reference[0])

    def one(i: int) -> list[str]:
        with httpx.Client(base_url=url) as client:  # a connection each: the kernel spreads them over front-ends
            body = client.post("/predict", json={"inputs": x[i % 64 : i % 64 + 1].tolist()}).raise_for_status().json()
        return [p["id"] for p in body["predictions"]]

    with ThreadPoolExecutor(16) as pool:
        ids = [i for found in pool.map(one, range(200)) for i in found]
    assert len(set(ids)) == 200
    models = {m["name"] for m in loopback.get(f"{url}/models").json()["models"]}
    assert models == {"digits-lenet5", "tabular"}, "the --artifacts flag reached the front-ends and the engine"
    seen = {}
    for _ in range(40):  # fresh connections reach both front-ends; each names itself and its loops in /health
        with httpx.Client(base_url=url) as client:
            pod_info = client.get("/health").json()["pod"]
        seen[pod_info["frontend"]] = pod_info
    assert sorted(seen) == [0, 1] and {p["frontends"] for p in seen.values()} == {2}
    assert seen[0]["loops"] == "every one" and seen[1]["loops"] == "the sets' folder"
    assert all(p["engine"]["answering"] for p in seen.values())
    families = {f.name: f for f in text_string_to_metric_families(loopback.get(f"{url}/metrics").text)}
    served = sum(
        s.value
        for s in families["calib_http_requests"].samples
        if s.name.endswith("_total") and s.labels["route"] == "/predict" and s.labels["status"] == "200"
    )
    assert served == 201, "every front-end's requests are counted once"

    def rows(family: str) -> float:
        return sum(
            s.value
            for s in families[family].samples
            if s.name.endswith("_sum") and s.labels["model"].startswith("digits-lenet5")
        )

    # the engine's onnxruntime batches and the front-ends' messages to it: each row counted once on each side
    assert rows("calib_batch_size_rows") == rows("calib_engine_message_rows") == 201
    batches = sum(s.value for s in families["calib_batch_size_rows"].samples if s.name.endswith("_count"))
    messages = sum(s.value for s in families["calib_engine_message_rows"].samples if s.name.endswith("_count"))
    assert 0 < batches <= messages

    def stored() -> bool:
        with sqlite3.connect(db) as con:
            return {r[0] for r in con.execute("select lower(hex(id)) from prediction_log")} >= set(ids)

    wait_for(stored, 10, "every answered id stored")
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    given = triton.InferInput("input", [1, 1, 8, 8], "FP32")
    given.set_data_from_numpy(x[:1])
    answer = client.infer("digits-lenet5", [given], outputs=[triton.InferRequestedOutput("probabilities")])
    np.testing.assert_array_equal(answer.as_numpy("probabilities")[0], reference[0])
    # tritonclient.grpc, unchanged, in a process of its own (tests/conformance/triton_grpc_client.py): its 3 seeded
    # rows answered as the in-process session answers them, with ids of their own, and a bad shape refused
    port = loopback.get(f"{url}/health").json()["grpc_port"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "conformance" / "triton_grpc_client.py"), f"127.0.0.1:{port}"]
        + ['{"digits-lenet5": [1, 8, 8]}'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])["models"]["digits-lenet5"]
    seeded = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    expected = create_runtime(DEFAULT / "model.onnx", Settings(), 1).run(seeded)["probabilities"]
    np.testing.assert_array_equal(np.asarray(got["infer"]["probabilities"], np.float32), expected)
    assert len(set(got["infer"]["ids"])) == 3 and not set(got["infer"]["ids"]) & set(ids)
    assert got["bad_shape"]["status"] == "StatusCode.INVALID_ARGUMENT"


def test_a_killed_engine_answers_503_and_is_back_within_the_bound(pod):
    url, process, _ = pod
    x = load_dataset("digits").test.x[:1].tolist()
    engine = next(pid for pid, cmd in _children(process.pid).items() if "service.engine" in cmd)
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: _gone(engine), 5, "the engine's end")
    refused = loopback.post(f"{url}/predict", json={"inputs": x})
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    # back: every front-end serves again (each sees the new engine within its reconnect interval), so that 20
    # requests in a row on fresh connections, whichever front-end takes them, are answered
    wait_for(lambda: _serves(url, x, 20), BACK_WITHIN, "the engine's restart")


def test_a_killed_front_end_is_replaced_while_the_other_serves(pod):
    url, process, _ = pod
    port = int(url.rsplit(":", 1)[1])
    x = load_dataset("digits").test.x[:1].tolist()
    wait_for(lambda: _listening(process.pid, port) == 2, BACK_WITHIN, "both front-ends listening")
    front = [pid for pid, cmd in _children(process.pid).items() if "service.engine" not in cmd]
    killed = _sockets(front[0]) & _listeners(port)
    assert killed, "the front-end to kill listens"
    os.kill(front[0], signal.SIGKILL)
    # its listening socket gone, not only the process: a connection queued on a listener as it closes is reset
    wait_for(lambda: _gone(front[0]) and not killed & _listeners(port), 5, "the front-end's listening socket closing")
    for _ in range(20):  # new connections go to the front-end that is left
        with httpx.Client(base_url=url) as client:
            assert client.post("/predict", json={"inputs": x}).status_code == 200
    wait_for(
        lambda: len([c for c in _children(process.pid).values() if "service.engine" not in c]) == 2, 10, "a new one"
    )
    assert front[0] not in _children(process.pid)
    wait_for(lambda: _listening(process.pid, port) == 2, BACK_WITHIN, "the new front-end listening")


@pytest.mark.parametrize("fault", ["sticky", "stuck"])
def test_an_engine_whose_device_failed_or_whose_session_is_stuck_exits_and_the_pod_restarts_it(pod, fault):
    url, process, db = pod
    x = load_dataset("digits").test.x[:1].tolist()
    engine = next(pid for pid, cmd in _children(process.pid).items() if "service.engine" in cmd)
    (db.parent / "fault").write_text(fault)
    started = time.monotonic()
    refused = loopback.post(f"{url}/predict", json={"inputs": x}, timeout=60)
    waited = time.monotonic() - started
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    # a sticky error is answered at once; a stuck call at the deadline, never later
    assert waited < (1.0 if fault == "sticky" else DEADLINE + 1.0), f"the 503 came after {waited:.1f} s"
    wait_for(lambda: _gone(engine), DEADLINE + 5, "the faulty engine's exit")
    wait_for(lambda: _serves(url, x, 20), BACK_WITHIN, "a new engine")
    assert engine not in _children(process.pid)


def test_sigterm_drains_the_pod_and_it_exits_0(pod):
    url, process, _ = pod
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
