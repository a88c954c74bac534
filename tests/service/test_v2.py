"""Open Inference Protocol v2: JSON requests, the binary extension, and tritonclient.http unchanged."""

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from calibkit.temperature import apply_temperature
from training.data import load_digits_splits

X = load_digits_splits().test.x[:6]


def test_server_and_health_endpoints(base_url):
    meta = httpx.get(f"{base_url}/v2").json()
    assert meta["name"] == "calibrated-serving" and "binary_tensor_data" in meta["extensions"]
    assert httpx.get(f"{base_url}/v2/health/live").status_code == 200
    assert httpx.get(f"{base_url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{base_url}/v2/models/toy/ready").json()["version"] == "2"
    assert httpx.get(f"{base_url}/v2/models/toy/versions/1/ready").status_code == 200
    assert httpx.get(f"{base_url}/v2/models/nope/ready").status_code == 404


def test_model_metadata(base_url):
    meta = httpx.get(f"{base_url}/v2/models/digits-lenet5").json()
    assert meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
    assert httpx.get(f"{base_url}/v2/models/toy/versions/1").json()["versions"] == ["1", "2"]


def test_json_infer_flat_and_nested(base_url):
    flat = {"id": "req-1", "inputs": [{"name": "input", "shape": [6, 1, 8, 8], "datatype": "FP32",
                                       "data": X.ravel().tolist()}]}
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", json=flat)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["model_name"], body["model_version"], body["id"]) == ("digits-lenet5", "1", "req-1")
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in body["outputs"]}
    assert outputs["probabilities"].shape == (6, 10)
    temperature = httpx.get(f"{base_url}/models").json()["models"][0]["versions"][0]["temperature"]
    np.testing.assert_allclose(outputs["probabilities"], apply_temperature(outputs["logits"], temperature), atol=1e-6)
    nested = {"inputs": [{"name": "input", "shape": [6, 1, 8, 8], "datatype": "FP64", "data": X.tolist()}],
              "outputs": [{"name": "probabilities"}]}
    body = httpx.post(f"{base_url}/v2/models/digits-lenet5/versions/1/infer", json=nested).json()
    assert [o["name"] for o in body["outputs"]] == ["probabilities"]
    np.testing.assert_allclose(np.array(body["outputs"][0]["data"]).reshape(6, 10), outputs["probabilities"], atol=1e-6)


def test_tritonclient_http_works_unchanged(base_url):
    client = triton.InferenceServerClient(url=base_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits-lenet5")
    assert client.get_model_metadata("digits-lenet5")["inputs"][0]["shape"] == [-1, 1, 8, 8]
    for binary in (True, False):
        tensor = triton.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X, binary_data=binary)
        outputs = [triton.InferRequestedOutput("probabilities", binary_data=binary),
                   triton.InferRequestedOutput("logits", binary_data=not binary)]
        result = client.infer("digits-lenet5", [tensor], outputs=outputs)
        probs, logits = result.as_numpy("probabilities"), result.as_numpy("logits")
        assert probs.shape == (6, 10) and logits.shape == (6, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    plain = client.infer("digits-lenet5", [tensor])  # no outputs named: all, binary by default
    np.testing.assert_allclose(plain.as_numpy("probabilities"), probs, atol=1e-7)
    with pytest.raises(triton.InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", [tensor])


V2_ERRORS = [
    ({"inputs": [{"name": "pixels", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]}, 400,
     "unknown input 'pixels'"),
    ({"inputs": [{"name": "input", "shape": [1, 8, 8], "datatype": "FP32", "data": [0] * 64}]}, 400,
     "does not match the model input [N, 1, 8, 8]"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "BYTES", "data": ["a"]}]}, 400,
     "datatype 'BYTES' is not supported"),
    ({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]}, 400,
     "holds 64 values but shape [2, 1, 8, 8] needs 128"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": ["x"] * 64}]}, 400,
     "must hold only numbers"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32"}]}, 400, "has no data"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}],
      "outputs": [{"name": "embeddings"}]}, 400, "unknown outputs ['embeddings']"),
    ({"inputs": [{"name": "input", "shape": [65, 1, 8, 8], "datatype": "FP32", "data": [0] * 64 * 65}]}, 400,
     "exceeds the limit of 64"),
    ({"inputs": []}, 400, "expected exactly 1 input tensor"),
    ({"input": []}, 400, "inputs: Field required"),
]


@pytest.mark.parametrize("payload, status, message", V2_ERRORS)
def test_v2_errors_are_400_with_a_message(base_url, payload, status, message):
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", json=payload)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_v2_unknown_model_bad_json_and_bad_binary_sizes(base_url):
    tensor = {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}
    assert httpx.post(f"{base_url}/v2/models/nope/infer", json={"inputs": [tensor]}).status_code == 404
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 256}}]}).encode()
    short = header + b"\0" * 100
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", content=short,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "does not fit" in r.json()["error"]
    extra = header + b"\0" * 300
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", content=extra,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "44 binary bytes are not claimed" in r.json()["error"]
    r = httpx.post(f"{base_url}/v2/models/digits-lenet5/infer", content=header,
                   headers={"Inference-Header-Content-Length": "99999"})
    assert r.status_code == 400 and "does not fit a body" in r.json()["error"]
