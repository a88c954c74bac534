"""The /predict, /models and /health contract against a real server on loopback."""

import base64
import io

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from bench.common import loopback
from calibkit.manifest import load_manifest
from calibkit.temperature import apply_temperature, softmax
from training.data import load_digits_splits

DIGITS = load_digits_splits().test


def _png(array: np.ndarray, fmt: str = "PNG") -> str:
    """An 8x8 digit as an image with dark ink on white, like a scan."""
    pixels = np.round((1.0 - array[0]) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def test_predict_contract(base_url):
    rows = DIGITS.x[:5].tolist()
    r = loopback.post(
        f"{base_url}/predict", json={"inputs": rows, "top_k": 3, "return_logits": True, "return_uncalibrated": True}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["model"], body["version"], body["provider"]) == ("digits-lenet5", "1", "CPUExecutionProvider")
    assert body["temperature"] == pytest.approx(
        load_manifest(f"{_artifact_dir()}/manifest.json").calibration.temperature
    )
    predictions = body["predictions"]
    assert len(predictions) == 5 and len({p["id"] for p in predictions}) == 5
    for p in predictions:
        probs = np.array(p["probabilities"])
        assert len(probs) == 10 and probs.sum() == pytest.approx(1.0, abs=1e-5)
        assert p["class_index"] == int(probs.argmax()) and p["label"] == str(p["class_index"])
        assert p["confidence"] == pytest.approx(probs.max())
        assert [t["class_index"] for t in p["top_k"]] == list(np.argsort(-probs, kind="stable")[:3])
        assert np.array(p["uncalibrated_probabilities"]) == pytest.approx(softmax(np.array(p["logits"])), abs=1e-6)
    assert np.mean([p["class_index"] == y for p, y in zip(predictions, DIGITS.y[:5])]) >= 0.8


def _artifact_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[3] / "artifacts" / "digits-lenet5" / "1"


def test_probabilities_are_temperature_scaled_logits_and_match_onnx(base_url):
    x = DIGITS.x[:40]
    body = loopback.post(f"{base_url}/predict", json={"inputs": x.tolist(), "return_logits": True}).json()
    probs = np.array([p["probabilities"] for p in body["predictions"]])
    logits = np.array([p["logits"] for p in body["predictions"]])
    np.testing.assert_allclose(probs, apply_temperature(logits, body["temperature"]), atol=1e-6)
    session = ort.InferenceSession(str(_artifact_dir() / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx_logits, onnx_probs = session.run(["logits", "probabilities"], {"input": x})
    np.testing.assert_allclose(probs, onnx_probs, atol=1e-6)
    np.testing.assert_allclose(logits, onnx_logits, atol=1e-5)


def test_row_layouts_and_images_give_the_same_prediction(base_url):
    x = DIGITS.x[:3]
    as_chw = loopback.post(f"{base_url}/predict", json={"inputs": x.tolist()}).json()
    as_hw = loopback.post(f"{base_url}/predict", json={"inputs": x[:, 0].tolist()}).json()
    as_flat = loopback.post(f"{base_url}/predict", json={"inputs": x.reshape(3, -1).tolist()}).json()
    images = loopback.post(f"{base_url}/predict", json={"inputs": [_png(r) for r in x]}).json()
    data_url = loopback.post(f"{base_url}/predict", json={"inputs": ["data:image/png;base64," + _png(x[0])]}).json()
    jpeg = loopback.post(f"{base_url}/predict", json={"inputs": [_png(x[0], "JPEG")]})
    assert jpeg.status_code == 200
    reference = np.array([p["probabilities"] for p in as_chw["predictions"]])
    for other in (as_hw, as_flat):
        np.testing.assert_allclose([p["probabilities"] for p in other["predictions"]], reference, atol=1e-6)
    # PNG pixels are quantised to 1/255 and inverted back by the service: same classes, close probabilities
    from_images = np.array([p["probabilities"] for p in images["predictions"]])
    assert list(from_images.argmax(1)) == list(reference.argmax(1))
    np.testing.assert_allclose(from_images, reference, atol=0.02)
    np.testing.assert_allclose(data_url["predictions"][0]["probabilities"], from_images[0], atol=1e-6)


def test_model_and_version_selection(base_url):
    row = [[[0.1, 0.2], [0.3, 0.4]]]
    latest = loopback.post(f"{base_url}/predict", json={"model": "toy", "inputs": row}).json()
    first = loopback.post(f"{base_url}/predict", json={"model": "toy", "version": "1", "inputs": row}).json()
    assert (latest["version"], latest["temperature"]) == ("2", 1.5)
    assert (first["version"], first["temperature"]) == ("1", 2.0)
    assert first["predictions"][0]["label"] in {"a", "b", "c"}


def test_models_and_health(base_url):
    models = loopback.get(f"{base_url}/models").json()
    assert models["default"] == "digits-lenet5"
    toy = next(m for m in models["models"] if m["name"] == "toy")
    assert [(v["version"], v["latest"]) for v in toy["versions"]] == [("1", False), ("2", True)]
    digits = next(m for m in models["models"] if m["name"] == "digits-lenet5")["versions"][0]
    assert digits["classes"] == [str(i) for i in range(10)] and digits["provider"] == "CPUExecutionProvider"
    assert digits["calibration"]["method"] == "temperature" and digits["preprocessing"]["invert"] is True
    health = loopback.get(f"{base_url}/health")
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["ready"] and len(body["models"]) == 3
    assert all(m["provider"] == "CPUExecutionProvider" for m in body["models"])


def test_request_id_is_echoed_or_assigned(base_url):
    echoed = loopback.get(f"{base_url}/health", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    assigned = loopback.get(f"{base_url}/health", headers={"X-Request-ID": "bad id with spaces"})
    assert len(assigned.headers["x-request-id"]) == 32


BAD_REQUESTS = [
    ({"model": "nope", "inputs": [[0]]}, 404, "model", "unknown model 'nope'"),
    ({"model": "toy", "version": "9", "inputs": [[0]]}, 404, "version", "has no version '9'"),
    ({"inputs": []}, 422, "inputs", "at least 1 item"),
    ({"inputs": [[0.0] * 64] * 65}, 422, "inputs", "at most 64"),
    ({"inputs": [[1.0, 2.0, 3.0]]}, 422, "inputs[0]", "has shape [3]; expected [1, 8, 8]"),
    ({"inputs": [[[0.0] * 8] * 8, [[0.0] * 7] * 8]}, 422, "inputs[1]", "has shape [8, 7]"),
    ({"inputs": [[["x"] * 8] * 8]}, 422, "inputs[0]", "only numbers"),
    ({"inputs": [[[True] * 8] * 8]}, 422, "inputs[0]", "only numbers"),
    ({"inputs": [[[0.0, [1.0]] + [0.0] * 6] * 8]}, 422, "inputs[0]", "rectangular"),
    ({"inputs": ["not base64!"]}, 422, "inputs[0]", "not valid base64"),
    ({"inputs": [base64.b64encode(b"plain text").decode()]}, 422, "inputs[0]", "could not be decoded as an image"),
    ({"inputs": [[0.0] * 64], "top_k": 0}, 422, "top_k", "greater than or equal to 1"),
    ({"inputs": [[0.0] * 64], "temperature": 3}, 422, "temperature", "Extra inputs are not permitted"),
    ({}, 422, "inputs", "Field required"),
    ({"inputs": "nope"}, 422, "inputs", "valid list"),
]


@pytest.mark.parametrize("payload, status, field, message", BAD_REQUESTS)
def test_bad_input_gets_a_4xx_naming_the_field(base_url, payload, status, field, message):
    r = loopback.post(f"{base_url}/predict", json=payload)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["field"] == field and message in error["message"]


def test_non_finite_values_gif_and_huge_images_are_refused(base_url):
    row = "[" + ",".join(["[" + ",".join(["NaN"] + ["0"] * 7) + "]"] + ["[" + ",".join(["0"] * 8) + "]"] * 7) + "]"
    r = loopback.post(
        f"{base_url}/predict", content='{"inputs": [' + row + "]}", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and "NaN or infinite" in r.json()["error"]["message"]
    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="GIF")
    r = loopback.post(f"{base_url}/predict", json={"inputs": [base64.b64encode(buffer.getvalue()).decode()]})
    assert r.status_code == 422 and "GIF image; send PNG or JPEG" in r.json()["error"]["message"]


def test_malformed_json_and_oversized_bodies(base_url):
    r = loopback.post(f"{base_url}/predict", content=b'{"inputs": [', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    big = b'{"inputs": [' + b"0," * 200_000 + b"0]}"
    r = loopback.post(f"{base_url}/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]["message"]

    def chunks():
        yield b'{"inputs": ['
        for _ in range(100):
            yield b"0," * 2000
        yield b"0]}"

    r = loopback.post(f"{base_url}/predict", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert loopback.get(f"{base_url}/health").status_code == 200  # the server is still fine


def test_unknown_routes_and_methods_keep_the_error_shape(base_url):
    assert loopback.get(f"{base_url}/nope").json()["error"]["code"] == "not_found"
    r = loopback.get(f"{base_url}/predict")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
