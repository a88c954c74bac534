"""The model repository: broken artifacts are refused without stopping the others; providers reported."""

import hashlib
import json
import logging
import shutil

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.common import loopback
from service.serving import runtime as runtime_module
from service.serving.buckets import Bucket
from service.serving.repository import ModelRepository
from service.serving.runtime import CPU, CUDA, batch_buckets, create_runtime, requested_providers
from service.settings import Settings


def _broken_repository(root, linear_artifact):
    linear_artifact(root, "good", "1")
    bad_sha = linear_artifact(root, "badsha", "1")
    (bad_sha / "model.onnx").write_bytes((bad_sha / "model.onnx").read_bytes() + b"tampered")
    missing = linear_artifact(root, "missing", "1")
    (missing / "model.onnx").unlink()
    bad_manifest = linear_artifact(root, "badmanifest", "1")
    data = json.loads((bad_manifest / "manifest.json").read_text())
    data["class_names"] = ["only-one"]
    (bad_manifest / "manifest.json").write_text(json.dumps(data))
    wrong_input = linear_artifact(root, "wronginput", "1")
    data = json.loads((wrong_input / "manifest.json").read_text())
    data["input"]["name"] = "pixels"
    (wrong_input / "manifest.json").write_text(json.dumps(data))
    misplaced = linear_artifact(root, "misplaced", "1")
    shutil.move(misplaced, root / "misplaced" / "3")
    not_onnx = linear_artifact(root, "notonnx", "1")
    (not_onnx / "model.onnx").write_bytes(b"not an onnx file")
    data = json.loads((not_onnx / "manifest.json").read_text())
    data["model_sha256"] = hashlib.sha256(b"not an onnx file").hexdigest()
    (not_onnx / "manifest.json").write_text(json.dumps(data))
    (root / "good" / "latest").mkdir()
    (root / "badserving").mkdir()
    (root / "badserving" / "serving.json").write_text('{"max_batch_size": 0}')
    # a manifest pointing at a valid model outside its version folder (checksum and all)
    escape = linear_artifact(root, "escape", "1")
    data = json.loads((escape / "manifest.json").read_text())
    data["model_file"] = "../../good/1/model.onnx"
    data["model_sha256"] = hashlib.sha256((root / "good" / "1" / "model.onnx").read_bytes()).hexdigest()
    (escape / "manifest.json").write_text(json.dumps(data))


def test_broken_artifacts_are_refused_and_the_good_one_serves(tmp_path, linear_artifact, server_for, caplog):
    _broken_repository(tmp_path, linear_artifact)
    with caplog.at_level(logging.ERROR, logger="service.serving.repository"):
        with server_for(Settings(artifacts=tmp_path)) as (base_url, _):
            health = loopback.get(f"{base_url}/health").json()
            served = loopback.post(f"{base_url}/predict", json={"inputs": [[0.1, 0.2, 0.3, 0.4]]})
            refused = loopback.post(f"{base_url}/predict", json={"model": "badsha", "inputs": [[0.1, 0.2, 0.3, 0.4]]})
            escaped = loopback.post(f"{base_url}/predict", json={"model": "escape", "inputs": [[0.1, 0.2, 0.3, 0.4]]})
    assert health["status"] == "degraded" and health["ready"]
    assert [m["name"] for m in health["models"]] == ["good"]
    # listed by their place in the artifacts directory: no absolute path of the machine is published
    assert str(tmp_path) not in json.dumps(health)
    errors = {f["path"]: f["error"] for f in health["failed_artifacts"]}
    assert "does not match the manifest's sha256" in errors["badsha/1"]
    assert "model file" in errors["missing/1"] and "is missing" in errors["missing/1"]
    assert "class_names" in errors["badmanifest/1"]
    assert "do not match the manifest input 'pixels'" in errors["wronginput/1"]
    assert "manifest says misplaced/1 but it lies in misplaced/3" in errors["misplaced/3"]
    assert "notonnx/1" in errors
    assert "version directories must be numbers" in errors["good/latest"]
    assert "invalid serving configuration" in errors["badserving"]
    assert "lies outside the version folder" in errors["escape/1"]
    assert served.status_code == 200 and served.json()["model"] == "good"
    assert refused.status_code == 404
    assert escaped.status_code == 404
    assert any("refused artifact" in r.message for r in caplog.records)


def test_no_loadable_model_means_not_ready(tmp_path, server_for):
    with server_for(Settings(artifacts=tmp_path / "nothing-here")) as (base_url, _):
        health = loopback.get(f"{base_url}/health")
        ready = loopback.get(f"{base_url}/v2/health/ready")
        predict = loopback.post(f"{base_url}/predict", json={"inputs": [[0.0]]})
    assert health.status_code == 503 and health.json()["status"] == "not_ready"
    assert "artifacts directory does not exist" in health.json()["failed_artifacts"][0]["error"]
    assert ready.status_code == 503
    assert predict.status_code == 503 and predict.json()["error"]["code"] == "not_ready"


def test_asking_for_cuda_without_a_gpu_warns_and_reports_cpu(tmp_path, linear_artifact, caplog):
    linear_artifact(tmp_path, "toy", "1")
    repository = ModelRepository(Settings(artifacts=tmp_path, device="cuda"))
    with caplog.at_level(logging.WARNING):
        repository.load()
    served = repository.get("toy")
    assert served.runtime.provider == CPU
    assert any("CUDA" in r.message and "CPUExecutionProvider" in r.message for r in caplog.records)


def test_a_service_asked_for_cuda_without_a_gpu_serves_on_cpu_and_says_so_everywhere(
    tmp_path, linear_artifact, server_for, caplog
):
    linear_artifact(tmp_path, "toy", "1")
    settings = Settings(artifacts=tmp_path, device="cuda", store={"url": f"sqlite:///{tmp_path / 'm.db'}"})
    with caplog.at_level(logging.INFO, logger="service"), server_for(settings) as (base_url, _):
        health = loopback.get(f"{base_url}/health").json()
        predicted = loopback.post(f"{base_url}/predict", json={"inputs": [[0.1, 0.2, 0.3, 0.4]]}).json()
        families = {f.name: f for f in text_string_to_metric_families(loopback.get(f"{base_url}/metrics").text)}
    model = health["models"][0]
    assert (model["provider"], model["requested_providers"], model["io_binding"]) == (CPU, [CUDA, CPU], False)
    assert (model["batch_buckets"], model["bucket_sessions"]) == ([], False)  # CUDA-only defaults, off on the CPU
    assert (model["cuda_graphs"], model["graph_fallback"], model["staging_bytes"]) == (False, "", 0)
    assert model["warmup_seconds"] > 0
    assert predicted["provider"] == CPU
    assert {s.labels["provider"] for s in families["calib_model_info"].samples} == {CPU}
    messages = [r.getMessage() for r in caplog.records]
    assert any("CUDA was requested" in m and CPU in m for m in messages)
    assert any(m.startswith("loaded toy version 1") and m.endswith(f"on {CPU}") for m in messages)


def test_io_binding_gives_the_outputs_of_a_plain_run(tmp_path, linear_artifact, monkeypatch):
    path = linear_artifact(tmp_path, "toy", "1") / "model.onnx"
    assert create_runtime(path, Settings()).io_binding is False  # auto: only for sessions on CUDA
    monkeypatch.setattr(runtime_module, "IO_BINDING", "off")
    plain = create_runtime(path, Settings())
    monkeypatch.setattr(runtime_module, "IO_BINDING", "on")
    bound = create_runtime(path, Settings())
    assert (plain.io_binding, bound.io_binding) == (False, True)
    x = np.random.default_rng(0).random((5, 1, 2, 2), dtype=np.float32)
    expected, got = plain.run(x), bound.run(x)
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    np.testing.assert_array_equal(bound.run(np.asfortranarray(x))["logits"], expected["logits"])


def test_auto_and_cpu_ask_for_cpu_on_a_machine_without_a_gpu():
    assert requested_providers("cpu") == [CPU]
    assert requested_providers("auto") == [CPU]  # no NVIDIA device node here


def test_default_model_setting(tmp_path, linear_artifact):
    linear_artifact(tmp_path, "alpha", "1")
    linear_artifact(tmp_path, "beta", "1")
    repository = ModelRepository(Settings(artifacts=tmp_path, default_model="beta"))
    repository.load()
    assert repository.get().name == "beta"
    missing = ModelRepository(Settings(artifacts=tmp_path, default_model="gamma"))
    missing.load()
    assert missing.default is None


def test_metrics_exposition_parses_and_counts_by_route_template(base_url):
    loopback.post(f"{base_url}/predict", json={"model": "toy", "inputs": [[0.1, 0.2, 0.3, 0.4]]})
    loopback.post(f"{base_url}/predict", json={"model": "toy", "inputs": [[0.1]]})
    loopback.get(f"{base_url}/v2/models/toy/versions/1")
    text = loopback.get(f"{base_url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["calib_http_requests"].samples
        if s.name == "calib_http_requests_total"
    }
    assert requests[("/predict", "200")] >= 1 and requests[("/predict", "422")] >= 1
    assert requests[("/v2/models/{name}/versions/{version}", "200")] >= 1
    for name in (
        "calib_http_request_duration_seconds",
        "calib_queue_duration_seconds",
        "calib_inference_duration_seconds",
        "calib_batch_size_rows",
    ):
        assert families[name].type == "histogram"
    assert families["calib_http_requests_in_flight"].type == "gauge"
    info = {
        (s.labels["model"], s.labels["version"], s.labels["provider"]) for s in families["calib_model_info"].samples
    }
    assert ("toy", "2", "CPUExecutionProvider") in info and ("digits-lenet5", "1", "CPUExecutionProvider") in info
    inference = [
        s
        for s in families["calib_inference_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["model"] == "toy:2"
    ]
    assert inference and inference[0].value >= 1


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("CALIB_BATCHING__MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("CALIB_BATCHING__MAX_QUEUE_DELAY_MS", "0.5")
    monkeypatch.setenv("CALIB_DEVICE", "cpu")
    settings = Settings()
    assert (settings.batching.max_batch_size, settings.batching.max_queue_delay_ms, settings.device) == (32, 0.5, "cpu")
    monkeypatch.setenv("CALIB_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device"):
        Settings()


def test_a_padding_session_runs_its_buckets_and_cuts_the_outputs_back(tmp_path, linear_artifact, monkeypatch):
    path = linear_artifact(tmp_path, "toy", "1") / "model.onnx"
    plain = create_runtime(path, Settings(runtime={"pad_batches": "off"}), max_batch_size=6)
    padded = create_runtime(path, Settings(runtime={"pad_batches": "on"}), max_batch_size=6)
    assert (plain.buckets, padded.buckets) == ((), (1, 2, 4, 6))
    assert create_runtime(path, Settings(), max_batch_size=6).buckets == ()  # auto: only for sessions on CUDA
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64) and batch_buckets(1) == (1,)
    shapes = []
    bucket_run, run = Bucket.run, padded._run
    monkeypatch.setattr(
        Bucket, "run", lambda self, parts, rows: shapes.append(self.size) or bucket_run(self, parts, rows)
    )
    padded._run = lambda session, x: shapes.append(len(x)) or run(session, x)
    for rows in (1, 3, 5, 6, 9):  # 9 rows: larger than every bucket, run as they come
        x = np.random.default_rng(rows).random((rows, 1, 2, 2), dtype=np.float32)
        expected, got = plain.run(x), padded.run(x)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
    assert shapes == [1, 4, 6, 6, 9]


def test_with_bucket_sessions_every_session_meets_one_input_shape(tmp_path, linear_artifact, monkeypatch):
    path = linear_artifact(tmp_path, "toy", "1") / "model.onnx"
    plain = create_runtime(path, Settings(runtime={"pad_batches": "off"}), max_batch_size=6)
    shared = create_runtime(path, Settings(runtime={"pad_batches": "on"}), max_batch_size=6)
    own = create_runtime(path, Settings(runtime={"pad_batches": "on", "bucket_sessions": "on"}), max_batch_size=6)
    assert shared.bucket_sessions == {}  # auto: a session per bucket only for sessions on CUDA
    assert sorted(own.bucket_sessions) == [1, 2, 4, 6] and own.session not in own.bucket_sessions.values()
    assert len({id(s) for s in own.bucket_sessions.values()}) == 4
    shapes: dict[int, set[int]] = {}
    bucket_run, run = Bucket.run, own._run
    monkeypatch.setattr(
        Bucket,
        "run",
        lambda self, parts, rows: (
            shapes.setdefault(id(self.session), set()).add(self.size) or bucket_run(self, parts, rows)
        ),
    )
    own._run = lambda session, x: shapes.setdefault(id(session), set()).add(len(x)) or run(session, x)
    # 9 rows: larger than every bucket, run as they come by the session that no bucket uses
    for rows in (1, 3, 5, 6, 2, 4, 1, 9):
        x = np.random.default_rng(rows).random((rows, 1, 2, 2), dtype=np.float32)
        expected, got = plain.run(x), own.run(x)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
    assert shapes == {
        id(own.bucket_sessions[1]): {1},
        id(own.bucket_sessions[2]): {2},
        id(own.bucket_sessions[4]): {4},
        id(own.bucket_sessions[6]): {6},
        id(own.session): {9},
    }


def test_every_session_of_a_padding_model_is_warmed_up_at_each_bucket(tmp_path, linear_artifact, monkeypatch):
    linear_artifact(tmp_path, "toy", "1")
    (tmp_path / "toy" / "serving.json").write_text(json.dumps({"max_batch_size": 8, "instances": 2}))
    seen = []
    original = Bucket.run
    monkeypatch.setattr(Bucket, "run", lambda self, parts, rows: seen.append(id(self)) or original(self, parts, rows))
    repository = ModelRepository(Settings(artifacts=tmp_path, runtime={"pad_batches": "on"}))
    repository.load()
    runtimes = repository.get("toy").runtimes
    assert len(runtimes) == 2 and all(r.buckets == (1, 2, 4, 8) for r in runtimes)
    assert sorted(seen) == sorted(id(b) for r in runtimes for b in r.bucket_runs)
    assert sorted(b.size for r in runtimes for b in r.bucket_runs) == [1, 1, 2, 2, 4, 4, 8, 8]
