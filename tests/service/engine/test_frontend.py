"""A service process in front of an engine (CALIB_POD__ENGINE_ENDPOINT): the same answers as the in-process path, bit
for bit, over /predict, v2 and gRPC, with ids that take labels; a dead engine answers 503 at once and readiness falls;
a restarted engine is served again."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.common import loopback
from service.serving.protocol import grpc_predict_v2_pb2 as pb
from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc
from service.settings import Settings
from training.data import load_dataset

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"
pytestmark = pytest.mark.e2e  # an engine process


def _engine(endpoint: str, artifacts: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "service.engine", "--endpoint", endpoint, "--artifacts", str(artifacts)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, server_for, linear_artifact):
    """(front-end url, in-process url, engine endpoint, artifacts, [engine process]) over the committed model and a
    feature-vector toy."""
    root = tmp_path_factory.mktemp("frontend")
    artifacts = root / "artifacts"
    shutil.copytree(DEFAULT, artifacts / "digits-lenet5" / "1")
    linear_artifact(artifacts, "tabular", "1", shape=(5,))
    endpoint = f"ipc://{root / 'engine.sock'}"
    engine = [_engine(endpoint, artifacts)]
    common = {"artifacts": artifacts, "grpc_port": 0, "default_model": "digits-lenet5"}
    front = Settings(**common, pod={"engine_endpoint": endpoint}, store={"url": f"sqlite:///{root / 'front.db'}"})
    alone = Settings(**common, store={"url": f"sqlite:///{root / 'alone.db'}"})
    try:
        with server_for(front) as (front_url, _), server_for(alone) as (alone_url, _):
            yield front_url, alone_url, endpoint, artifacts, engine
    finally:
        engine[0].terminate()
        engine[0].wait(30)


def test_the_front_end_answers_as_the_in_process_service_bit_for_bit(pair):
    front, alone = pair[0], pair[1]
    x = load_dataset("digits").test.x[:7]
    for body in (
        {"inputs": x.tolist(), "return_logits": True, "return_p_values": True},
        {"model": "tabular", "inputs": np.random.default_rng(0).normal(0, 1, (3, 5)).tolist()},
    ):
        got, want = (loopback.post(f"{url}/predict", json=body).raise_for_status().json() for url in (front, alone))
        assert got["provider"] == want["provider"] and got["conformal"] == want["conformal"]
        for mine, theirs in zip(got["predictions"], want["predictions"]):
            assert mine["id"] != theirs["id"]
            for key in ("probabilities", "logits", "prediction_set", "p_values", "label", "confidence"):
                assert mine[key] == theirs[key], key
    tensor = {"name": "input", "datatype": "FP32", "shape": [7, 1, 8, 8], "data": x.ravel().tolist()}
    v2 = [
        loopback.post(f"{url}/v2/models/digits-lenet5/infer", json={"inputs": [tensor]}).raise_for_status().json()
        for url in (front, alone)
    ]
    assert [o["data"] for o in v2[0]["outputs"] if o["name"] != "prediction_id"] == [
        o["data"] for o in v2[1]["outputs"] if o["name"] != "prediction_id"
    ]
    port = loopback.get(f"{front}/health").json()["grpc_port"]
    request = pb.ModelInferRequest(model_name="digits-lenet5")
    request.inputs.add(name="input", datatype="FP32", shape=[7, 1, 8, 8])
    request.raw_input_contents.append(x.tobytes())
    answer = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}")).ModelInfer(
        request, timeout=30
    )
    names = [o.name for o in answer.outputs]
    probabilities = np.frombuffer(answer.raw_output_contents[names.index("probabilities")], np.float32)
    np.testing.assert_array_equal(probabilities, np.array(v2[1]["outputs"][1]["data"], np.float32))
    ids = [p["id"] for p in loopback.post(f"{front}/predict", json={"inputs": x[:2].tolist()}).json()["predictions"]]
    deadline = time.monotonic() + 10
    while True:
        answer = loopback.post(
            f"{front}/feedback", json={"items": [{"prediction_id": i, "label": 3} for i in ids]}
        ).json()
        if answer["accepted"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer["accepted"] + len(answer["pending"]) == 2 and not answer["rejected"]


def test_a_dead_engine_answers_503_at_once_and_a_restarted_one_is_served_again(pair):
    front, _, endpoint, artifacts, engine = pair
    x = load_dataset("digits").test.x[:1].tolist()
    assert loopback.get(f"{front}/v2/health/ready").status_code == 200
    engine[0].send_signal(signal.SIGKILL)
    engine[0].wait(10)
    time.sleep(0.3)
    started = time.monotonic()
    refused = loopback.post(f"{front}/predict", json={"inputs": x})
    assert time.monotonic() - started < 1.0
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "engine_unavailable"
    assert loopback.get(f"{front}/v2/health/ready").status_code == 503
    engine[0] = _engine(endpoint, artifacts)
    deadline = time.monotonic() + 60
    while loopback.get(f"{front}/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the front-end did not see the restarted engine"
        time.sleep(0.1)
    assert loopback.post(f"{front}/predict", json={"inputs": x}).status_code == 200
