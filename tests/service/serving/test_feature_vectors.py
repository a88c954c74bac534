"""Models over feature vectors ([N, F], no image preprocessing) are served from JSON arrays, v2 tensors and gRPC;
a row of another width gets each protocol's wrong-shape error naming the shape, and an image is refused."""

from __future__ import annotations

import base64

import grpc
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bench.common import loopback
from calibkit.temperature import softmax
from service.serving.protocol import grpc_predict_v2_pb2 as pb
from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc
from service.settings import Settings

F = 5


@pytest.fixture(scope="module")
def vectors(tmp_path_factory, linear_artifact, server_for):
    """(base_url, W, b, T) of a server whose one model takes feature vectors of F numbers."""
    root = tmp_path_factory.mktemp("vectors")
    directory = linear_artifact(root / "artifacts", "tabular", "1", temperature=1.5, seed=3, shape=(F,))
    settings = Settings(
        artifacts=root / "artifacts", grpc_port=0, default_model=None, store={"url": f"sqlite:///{root / 'store.db'}"}
    )
    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(directory / "model.onnx")).graph.initializer}
    with server_for(settings) as (url, _):
        yield url, weights["W"].astype(np.float64), weights["b"].astype(np.float64), 1.5


def _rows(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).normal(0, 1, (n, F)).astype(np.float32)


def test_json_arrays_get_the_calibrated_probabilities(vectors):
    url, w, b, t = vectors
    x = _rows()
    body = loopback.post(f"{url}/predict", json={"model": "tabular", "inputs": x.tolist()}).raise_for_status().json()
    got = np.array([p["probabilities"] for p in body["predictions"]])
    np.testing.assert_allclose(got, softmax((x.astype(np.float64) @ w + b) / t), atol=1e-6)
    models = loopback.get(f"{url}/models").json()["models"][0]["versions"][0]
    assert models["input"]["shape"] == [None, F] and models["preprocessing"] is None
    metadata = loopback.get(f"{url}/v2/models/tabular").json()
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, F]}]
    assert metadata["parameters"]["preprocessing"] == "null" and "image_polarity" not in metadata["parameters"]


@pytest.mark.parametrize(
    "row, message",
    [
        ([1.0] * (F + 1), f"has shape [{F + 1}]; expected [{F}] (a feature vector of {F} numbers)"),
        ([[1.0] * F], f"has shape [1, {F}]; expected [{F}]"),
        (base64.b64encode(b"\x89PNG").decode(), "is a string, but this model takes numbers only"),
    ],
)
def test_predict_refuses_rows_of_another_shape_and_images_with_422(vectors, row, message):
    url = vectors[0]
    response = loopback.post(f"{url}/predict", json={"model": "tabular", "inputs": [_rows(1)[0].tolist(), row]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == "inputs[1]" and error["message"].startswith(message), error


def test_v2_rest_serves_vectors_and_refuses_another_width_with_400(vectors):
    url = vectors[0]
    x = _rows(2)
    tensor = {"name": "input", "datatype": "FP32", "shape": [2, F], "data": x.ravel().tolist()}
    ok = loopback.post(f"{url}/v2/models/tabular/infer", json={"inputs": [tensor]})
    assert ok.status_code == 200 and ok.json()["outputs"][1]["shape"] == [2, 3]
    wrong = tensor | {"shape": [2, F - 1], "data": x[:, 1:].ravel().tolist()}
    response = loopback.post(f"{url}/v2/models/tabular/infer", json={"inputs": [wrong]})
    assert response.status_code == 400
    assert response.json()["error"] == f"inputs[0].shape: shape [2, {F - 1}] does not match the model input [N, {F}]"


def test_grpc_serves_vectors_and_refuses_another_width_with_invalid_argument(vectors):
    url = vectors[0]
    port = loopback.get(f"{url}/health").json()["grpc_port"]
    stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    def request(x: np.ndarray) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="tabular")
        message.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        message.raw_input_contents.append(x.tobytes())
        return message

    answer = stub.ModelInfer(request(_rows(2)), timeout=30)
    assert [o.name for o in answer.outputs][:2] == ["logits", "probabilities"]
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request(_rows(2)[:, :3].copy()), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == f"inputs[0].shape: shape [2, 3] does not match the model input [N, {F}]"
