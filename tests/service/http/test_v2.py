"""Open Inference Protocol v2: JSON requests, the binary extension, tritonclient.http unchanged, and
v2 inferences logged for monitoring like /predict."""

import json

import numpy as np
import pytest
import tritonclient.http as triton

from bench.common import loopback
from calibkit.temperature import apply_temperature
from service.settings import Settings
from tests.service.conftest import flush_prediction_log
from training.data import load_digits_splits

TEST = load_digits_splits().test
X, Y = TEST.x[:6], TEST.y[:6]


def test_server_and_health_endpoints(base_url):
    meta = loopback.get(f"{base_url}/v2").json()
    assert meta["name"] == "calibrated-serving" and "binary_tensor_data" in meta["extensions"]
    assert loopback.get(f"{base_url}/v2/health/live").status_code == 200
    assert loopback.get(f"{base_url}/v2/health/ready").status_code == 200
    assert loopback.get(f"{base_url}/v2/models/toy/ready").json()["version"] == "2"
    assert loopback.get(f"{base_url}/v2/models/toy/versions/1/ready").status_code == 200
    assert loopback.get(f"{base_url}/v2/models/nope/ready").status_code == 404


def test_model_metadata(base_url):
    meta = loopback.get(f"{base_url}/v2/models/digits-lenet5").json()
    assert meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [
        ("logits", "FP32"),
        ("probabilities", "FP32"),
        ("prediction_id", "BYTES"),
        ("prediction_set", "BOOL"),  # the default artifact has conformal scores: its sets and p-values
        ("conformal_p_values", "FP32"),
    ]
    # every parameter value is a string, number or boolean (the protocol's rule); lists and objects JSON-encoded
    assert all(isinstance(v, str | int | float | bool) for v in meta["parameters"].values())
    # what an image must look like: the manifest's preprocessing and its polarity in words
    assert json.loads(meta["parameters"]["preprocessing"])["invert"] is True
    assert json.loads(meta["parameters"]["classes"]) == [str(i) for i in range(10)]
    assert meta["parameters"]["image_polarity"].startswith("dark strokes on a light background")
    assert loopback.get(f"{base_url}/v2/models/toy/versions/1").json()["versions"] == ["1", "2"]


def test_json_infer_flat_and_nested(base_url):
    flat = {
        "id": "req-1",
        "inputs": [{"name": "input", "shape": [6, 1, 8, 8], "datatype": "FP32", "data": X.ravel().tolist()}],
    }
    r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", json=flat)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["model_name"], body["model_version"], body["id"]) == ("digits-lenet5", "1", "req-1")
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in body["outputs"]}
    # no outputs named: every output the metadata lists, as the protocol says
    assert [(o["name"], o["datatype"], o["shape"]) for o in body["outputs"]] == [
        ("logits", "FP32", [6, 10]),
        ("probabilities", "FP32", [6, 10]),
        ("prediction_id", "BYTES", [6]),
        ("prediction_set", "BOOL", [6, 10]),
        ("conformal_p_values", "FP32", [6, 10]),
    ]
    meta = loopback.get(f"{base_url}/v2/models/digits-lenet5").json()
    assert [o["name"] for o in body["outputs"]] == [o["name"] for o in meta["outputs"]]
    assert outputs["prediction_set"].any(axis=1).all() and outputs["prediction_set"].dtype == bool
    assert ((outputs["conformal_p_values"] > 0) & (outputs["conformal_p_values"] <= 1)).all()
    assert list(outputs["prediction_id"]) == body["parameters"]["prediction_ids"].split(",")
    assert outputs["probabilities"].shape == (6, 10)
    temperature = loopback.get(f"{base_url}/models").json()["models"][0]["versions"][0]["temperature"]
    np.testing.assert_allclose(outputs["probabilities"], apply_temperature(outputs["logits"], temperature), atol=1e-6)
    nested = {
        "inputs": [{"name": "input", "shape": [6, 1, 8, 8], "datatype": "FP64", "data": X.tolist()}],
        "outputs": [{"name": "probabilities"}],
    }
    body = loopback.post(f"{base_url}/v2/models/digits-lenet5/versions/1/infer", json=nested).json()
    assert [o["name"] for o in body["outputs"]] == ["probabilities"]
    assert len(body["id"]) == 32 and body["id"] != _json_infer(base_url, X[:1])["id"]  # none asked: a fresh one each
    np.testing.assert_allclose(np.array(body["outputs"][0]["data"]).reshape(6, 10), outputs["probabilities"], atol=1e-6)


def test_tritonclient_http_works_unchanged(base_url):
    client = triton.InferenceServerClient(url=base_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits-lenet5")
    assert client.get_model_metadata("digits-lenet5")["inputs"][0]["shape"] == [-1, 1, 8, 8]
    for binary in (True, False):
        tensor = triton.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X, binary_data=binary)
        outputs = [
            triton.InferRequestedOutput("probabilities", binary_data=binary),
            triton.InferRequestedOutput("logits", binary_data=not binary),
        ]
        result = client.infer("digits-lenet5", [tensor], outputs=outputs)
        probs, logits = result.as_numpy("probabilities"), result.as_numpy("logits")
        assert probs.shape == (6, 10) and logits.shape == (6, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    plain = client.infer("digits-lenet5", [tensor])  # no outputs named: all, binary by default
    np.testing.assert_allclose(plain.as_numpy("probabilities"), probs, atol=1e-7)
    with pytest.raises(triton.InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", [tensor])


V2_ERRORS = [
    (
        {"inputs": [{"name": "pixels", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]},
        400,
        "unknown input 'pixels'",
    ),
    (
        {"inputs": [{"name": "input", "shape": [1, 8, 8], "datatype": "FP32", "data": [0] * 64}]},
        400,
        "does not match the model input [N, 1, 8, 8]",
    ),
    (
        {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "BYTES", "data": ["a"]}]},
        400,
        "datatype 'BYTES' is not supported",
    ),
    (
        {"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}]},
        400,
        "holds 64 values but shape [2, 1, 8, 8] needs 128",
    ),
    (
        {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": ["x"] * 64}]},
        400,
        "must hold only numbers",
    ),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32"}]}, 400, "has no data"),
    (
        {
            "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}],
            "outputs": [{"name": "embeddings"}],
        },
        400,
        "unknown outputs ['embeddings']",
    ),
    (
        {"inputs": [{"name": "input", "shape": [65, 1, 8, 8], "datatype": "FP32", "data": [0] * 64 * 65}]},
        400,
        "exceeds the limit of 64",
    ),
    ({"inputs": []}, 400, "at least 1 item"),
    ({"input": []}, 400, "inputs: Field required"),
]


@pytest.mark.parametrize("payload, status, message", V2_ERRORS)
def test_v2_errors_are_400_with_a_message(base_url, payload, status, message):
    r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", json=payload)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_v2_unknown_model_bad_json_and_bad_binary_sizes(base_url):
    tensor = {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64}
    assert loopback.post(f"{base_url}/v2/models/nope/infer", json={"inputs": [tensor]}).status_code == 404
    r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    header = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "parameters": {"binary_data_size": 256}}
            ]
        }
    ).encode()
    short = header + b"\0" * 100
    r = loopback.post(
        f"{base_url}/v2/models/digits-lenet5/infer",
        content=short,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "does not fit" in r.json()["error"]
    extra = header + b"\0" * 300
    r = loopback.post(
        f"{base_url}/v2/models/digits-lenet5/infer",
        content=extra,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "44 binary bytes are not claimed" in r.json()["error"]
    r = loopback.post(
        f"{base_url}/v2/models/digits-lenet5/infer",
        content=header,
        headers={"Inference-Header-Content-Length": "99999"},
    )
    assert r.status_code == 400 and "does not fit a body" in r.json()["error"]


def test_a_body_declared_over_the_limit_is_a_413_in_the_protocols_error_format(base_url):
    r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", content=b"0" * (300 * 1024))
    assert r.status_code == 413 and isinstance(r.json()["error"], str) and "exceeds the limit" in r.json()["error"]
    assert r.headers["connection"] == "close"


def _json_infer(base_url, x, **extra) -> dict:
    payload = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        **extra,
    }
    r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def _binary_infer(base_url, x) -> tuple[dict, bytes]:
    """A request with the binary tensor extension, all outputs as binary: the response's JSON header and the bytes."""
    header = json.dumps(
        {
            "parameters": {"binary_data_output": True},
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
        }
    ).encode()
    r = loopback.post(
        f"{base_url}/v2/models/digits-lenet5/infer",
        content=header + x.astype(np.float32).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream", r.text
    split = int(r.headers["Inference-Header-Content-Length"])
    return json.loads(r.content[:split]), r.content[split:]


def _labels(base_url) -> int:
    return loopback.get(f"{base_url}/calibration", params={"model": "digits-lenet5", "window": "1h"}).json()["n"]


def _assert_logged_and_labelled(server, ids, probabilities):
    """The rows of ``ids`` are stored as scored, and feedback on them is accepted and counted by /calibration."""
    base_url, app = server
    assert len(ids) == len(set(ids)) == len(probabilities)
    flush_prediction_log(app)
    stored = app.state.parts.store.predictions.fetch(ids)
    assert [(stored[i].model, stored[i].version, stored[i].predicted) for i in ids] == [
        ("digits-lenet5", "1", int(k)) for k in probabilities.argmax(axis=1)
    ]
    np.testing.assert_allclose([stored[i].confidence for i in ids], probabilities.max(axis=1), atol=1e-6)
    before = _labels(base_url)
    items = [{"prediction_id": i, "label": int(y)} for i, y in zip(ids, Y)]
    r = loopback.post(f"{base_url}/feedback", json={"items": items})
    assert r.status_code == 200 and r.json() == {"accepted": len(ids), "pending": [], "rejected": []}, r.text
    assert _labels(base_url) == before + len(ids)


def test_json_infer_is_logged_and_its_prediction_ids_take_feedback(server):
    body = _json_infer(server[0], X, outputs=[{"name": "probabilities"}])
    ids = body["parameters"]["prediction_ids"].split(",")
    assert len(ids) == len(X)
    probabilities = np.array(body["outputs"][0]["data"]).reshape(body["outputs"][0]["shape"])
    _assert_logged_and_labelled(server, ids, probabilities)


def test_tritonclient_binary_infer_is_logged_and_its_prediction_ids_take_feedback(server):
    client = triton.InferenceServerClient(url=server[0].removeprefix("http://"))
    tensor = triton.InferInput("input", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    result = client.infer(
        "digits-lenet5",
        [tensor],
        outputs=[
            triton.InferRequestedOutput("probabilities", binary_data=True),
            triton.InferRequestedOutput("prediction_id", binary_data=True),
        ],
    )
    ids = [i.decode() for i in result.as_numpy("prediction_id")]
    assert len(ids) == len(X) and ids == result.get_response()["parameters"]["prediction_ids"].split(",")
    _assert_logged_and_labelled(server, ids, result.as_numpy("probabilities"))


def test_prediction_counter_equals_the_rows_v2_logs(server):
    base_url, app = server
    registry = app.state.parts.metrics.registry

    def counts() -> tuple[float, float]:
        flush_prediction_log(app)
        return (
            registry.get_sample_value("calib_predictions_total", {"model": "digits-lenet5", "version": "1"}) or 0.0,
            registry.get_sample_value("calib_prediction_log_written_total") or 0.0,
        )

    predicted, written = counts()
    json_ids = _json_infer(base_url, X)["parameters"]["prediction_ids"].split(",")
    header, _ = _binary_infer(base_url, X[:4])
    binary_ids = header["parameters"]["prediction_ids"].split(",")
    assert (len(json_ids), len(binary_ids)) == (6, 4)
    now_predicted, now_written = counts()
    assert now_predicted - predicted == now_written - written == 10
    assert len(app.state.parts.store.predictions.fetch(json_ids + binary_ids)) == 10


def test_without_prediction_logging_v2_answers_ids_as_predict_does_and_stores_nothing(
    repository_dir, tmp_path, server_for
):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        prediction_log={"enabled": False},
        store={"url": f"sqlite:///{tmp_path / 'unlogged.db'}"},
    )
    with server_for(settings) as (base_url, app):
        predict_ids = [
            p["id"] for p in loopback.post(f"{base_url}/predict", json={"inputs": X.tolist()}).json()["predictions"]
        ]
        json_ids = _json_infer(base_url, X)["parameters"]["prediction_ids"].split(",")
        binary_ids = _binary_infer(base_url, X[:4])[0]["parameters"]["prediction_ids"].split(",")
        assert (len(predict_ids), len(json_ids), len(binary_ids)) == (6, 6, 4)
        flush_prediction_log(app)
        assert app.state.parts.store.predictions.fetch(predict_ids + json_ids + binary_ids) == {}
        assert (
            app.state.parts.metrics.registry.get_sample_value(
                "calib_predictions_total", {"model": "digits-lenet5", "version": "1"}
            )
            == 16
        )


def _phase_count(base_url: str, route: str, phase: str) -> float:
    pattern = f'calib_request_phase_duration_seconds_count{{phase="{phase}",route="{route}"}}'
    lines = [line for line in loopback.get(f"{base_url}/metrics").text.splitlines() if line.startswith(pattern)]
    return float(lines[0].split()[-1]) if lines else 0.0


@pytest.mark.parametrize("route", ["/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"])
def test_infer_runs_on_the_fast_path_and_times_its_phases(base_url, route):
    """v2 infer is served by the plain ASGI endpoint of /predict's fast path: its phases are timed under the
    route template, and the route's request counter carries the template, not the raw path."""
    x = load_digits_splits().test.x[:3]
    path = route.format(name="digits-lenet5", version="1")
    before = {phase: _phase_count(base_url, route, phase) for phase in ("parse", "validate", "batch", "encode")}
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    assert loopback.post(f"{base_url}{path}", json=body).status_code == 200
    for phase, count in before.items():
        assert _phase_count(base_url, route, phase) == count + 1, phase
    assert f'route="{route}"' in loopback.get(f"{base_url}/metrics").text
    assert loopback.get(f"{base_url}{path}").status_code == 405


def test_the_fields_the_protocol_allows_are_accepted_and_ignored(base_url):
    # kserve's InferRequest.to_rest() and Triton's examples send model_name; the spec's schemas allow extra fields
    body = _json_infer(
        base_url, X[:2], model_name="digits-lenet5", model_version="1", outputs=[{"name": "probabilities", "extra": 1}]
    )
    assert [o["name"] for o in body["outputs"]] == ["probabilities"]


def test_binary_prediction_ids_are_a_bytes_tensor_and_the_old_list_is_there_for_one_release(base_url):
    header, blob = _binary_infer(base_url, X[:3])
    sizes = {o["name"]: o["parameters"]["binary_data_size"] for o in header["outputs"]}
    assert [o["datatype"] for o in header["outputs"]] == ["FP32", "FP32", "BYTES", "BOOL", "FP32"]
    start = sizes["logits"] + sizes["probabilities"]
    raw = blob[start : start + sizes["prediction_id"]]
    ids, offset = [], 0
    while offset < len(raw):  # the extension's BYTES layout: a 4-byte little-endian length, then the bytes
        n = int.from_bytes(raw[offset : offset + 4], "little")
        ids.append(raw[offset + 4 : offset + 4 + n].decode())
        offset += 4 + n
    assert len(raw) == sizes["prediction_id"] and ids == header["parameters"]["prediction_ids"].split(",")
    legacy = _json_infer(base_url, X[:2], parameters={"prediction_ids_format": "list"})
    assert isinstance(legacy["parameters"]["prediction_ids"], list) and len(legacy["parameters"]["prediction_ids"]) == 2
