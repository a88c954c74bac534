"""Hostile input and store faults: a clear 4xx or a 503 with Retry-After, never a 500, nothing accepted lost,
nothing of the machine's internals in a response."""

import io
import json
import logging
import shutil
import subprocess
import threading
import time

import numpy as np
import psycopg
import pytest
from PIL import Image

from bench.common import loopback
from service.settings import Settings
from service.store.rows import CalibrationKey
from training.data import load_digits_splits

DEEP = b"[" * 100_000 + b"]" * 100_000


def _digit_png(image: np.ndarray) -> bytes:
    """A digits test image (ink = 1) as an 8-bit grey PNG in the polarity the manifest expects (its ``invert``):
    dark strokes on a light background, as on paper."""
    buffer = io.BytesIO()
    Image.fromarray(np.round(255 * (1 - image[0])).astype(np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def admin(repository_dir, server_for, tmp_path_factory):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        auth={"admin_tokens": "admin:s3cret"},
        store={"url": f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'store.db'}"},
    )
    with server_for(settings) as running:
        yield running


@pytest.mark.parametrize(
    "path, headers",
    [
        ("/predict", {}),
        ("/feedback", {}),
        ("/admin/recalibrate", {"Authorization": "Bearer s3cret"}),
        ("/admin/calibration/activate", {"Authorization": "Bearer s3cret"}),
        ("/v2/models/digits-lenet5/infer", {}),
    ],
)
def test_deeply_nested_json_is_a_400_and_the_server_lives_on(admin, path, headers):
    base_url, _ = admin
    r = loopback.post(f"{base_url}{path}", content=DEEP, headers={"Content-Type": "application/json", **headers})
    assert r.status_code == 400, r.text
    assert "depth" in r.text
    assert loopback.get(f"{base_url}/health").status_code == 200


def test_booleans_are_not_probabilities(admin):
    """JSON true/false are refused where numbers are required (a lax parser would read them as 1.0 and 0.0)."""
    base_url, _ = admin
    r = loopback.post(
        f"{base_url}/feedback",
        json={
            "items": [
                {"probabilities": [0.5, 0.5] + [0.0] * 8, "label": 0, "model": "digits-lenet5"},
                {"probabilities": [False, True] + [False] * 8, "label": 1, "model": "digits-lenet5"},
            ]
        },
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "items[1].probabilities[0]"


def test_a_body_that_is_not_json_or_an_upload_is_a_415_naming_the_supported_types(admin):
    base_url, _ = admin
    for path, body in (("/predict", '{"inputs": [[0]]}'), ("/feedback", '{"items": []}')):
        r = loopback.post(f"{base_url}{path}", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["field"] == "headers.content-type"
        assert "application/json" in r.json()["error"]["message"]
    mixed = loopback.post(
        f"{base_url}/predict", content=b"--x\r\n\r\n--x--", headers={"Content-Type": "multipart/mixed; boundary=x"}
    )
    assert mixed.status_code == 415 and "multipart/form-data" in mixed.json()["error"]["message"]
    upload = loopback.post(f"{base_url}/feedback", files={"file": ("a.png", b"x")})
    assert upload.status_code == 415


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_images_upload_as_multipart_form_data_with_curl(admin, tmp_path):
    base_url, _ = admin
    test = load_digits_splits().test
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"digit{i}.png")
        paths[-1].write_bytes(_digit_png(test.x[i]))
    files = [arg for path in paths for arg in ("-F", f"file=@{path}")]
    command = ["curl", "-s", "-w", "\n%{http_code}", "-F", "top_k=2", *files, f"{base_url}/predict"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    body, status = out.rsplit("\n", 1)
    assert status == "200", body
    predictions = json.loads(body)["predictions"]
    assert [p["class_index"] for p in predictions] == test.y[:4].tolist()
    assert all(len(p["top_k"]) == 2 for p in predictions)
    empty = loopback.post(f"{base_url}/predict", data={"model": "digits-lenet5"}, files={"note": (None, "no file")})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "inputs"
    broken = loopback.post(f"{base_url}/predict", files={"file": ("x.png", b"not an image", "image/png")})
    assert broken.status_code == 422 and broken.json()["error"]["field"] == "inputs[0]"
    malformed = loopback.post(
        f"{base_url}/predict", content=b"--x\r\nno headers", headers={"Content-Type": "multipart/form-data; boundary=x"}
    )
    assert malformed.status_code == 422 and malformed.json()["error"]["field"] in ("body", "inputs"), malformed.text
    too_many = loopback.post(f"{base_url}/predict", files=[("file", (f"{i}.png", b"x")) for i in range(1025)])
    assert too_many.status_code == 422 and "body" == too_many.json()["error"]["field"], too_many.text


def test_admin_checks_the_token_before_the_body_and_the_scheme_in_any_case(admin):
    base_url, _ = admin
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        r = loopback.post(f"{base_url}/admin/recalibrate", content=b'{"window": [1, 2]', headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith('Bearer realm="calibrated-serving"')
        assert "window" not in r.text
    for scheme in ("bearer", "BEARER", "Bearer"):
        r = loopback.post(
            f"{base_url}/admin/calibration/activate",
            json={"calibration_version": 0},
            headers={"Authorization": f"{scheme} s3cret"},
        )
        assert r.status_code == 200, r.text
    bad = loopback.post(
        f"{base_url}/admin/recalibrate", json={"window": "ten"}, headers={"Authorization": "bearer s3cret"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "window"


@pytest.mark.e2e  # needs PostgreSQL
def test_health_reports_an_exhausted_pool_as_degraded(repository_dir, server_for, pg_url):
    settings = Settings(
        artifacts=repository_dir, default_model="digits-lenet5", store={"url": pg_url, "timeout_seconds": 1}
    )
    with server_for(settings) as (base_url, app):
        engine = app.state.parts.store.db.engine
        held = [engine.connect() for _ in range(engine.pool.size() + engine.pool._max_overflow)]
        try:
            r = loopback.get(f"{base_url}/health", timeout=10)
        finally:
            for connection in held:
                connection.close()
        assert r.status_code == 200 and r.json()["status"] == "degraded" and not r.json()["storage"]["up"]
        assert loopback.get(f"{base_url}/health").json()["status"] == "ok"


@pytest.mark.e2e  # needs PostgreSQL
def test_a_locked_store_answers_503_in_bounded_time_and_loses_nothing(repository_dir, server_for, pg_url):
    settings = Settings(
        artifacts=repository_dir, default_model="digits-lenet5", store={"url": pg_url, "timeout_seconds": 1}
    )
    x = load_digits_splits().test.x[:20]
    with server_for(settings) as (base_url, app):
        ids = [p["id"] for p in loopback.post(f"{base_url}/predict", json={"inputs": x.tolist()}).json()["predictions"]]
        first = loopback.post(
            f"{base_url}/feedback", json={"items": [{"prediction_id": i, "label": 0} for i in ids[:10]]}
        )
        assert first.status_code == 200 and first.json()["accepted"] == 10
        locker = psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=False)
        locker.execute("LOCK TABLE labels IN ACCESS EXCLUSIVE MODE")
        release = threading.Timer(8.0, locker.rollback)  # the lock is let go in any case
        release.start()
        try:
            started = time.monotonic()
            blocked = loopback.post(
                f"{base_url}/feedback", json={"items": [{"prediction_id": i, "label": 0} for i in ids[10:]]}, timeout=30
            )
            waited = time.monotonic() - started
        finally:
            release.cancel()
            locker.rollback()
            locker.close()
        assert blocked.status_code == 503 and blocked.headers["retry-after"] == "1", blocked.text
        assert waited < 5.0
        again = loopback.post(
            f"{base_url}/feedback", json={"items": [{"prediction_id": i, "label": 0} for i in ids[10:]]}
        )
        assert again.status_code == 200 and again.json()["accepted"] == 10
        assert len(app.state.parts.store.labels.recent(CalibrationKey("digits-lenet5", "1", 0), 100)) == 20


def test_an_unreachable_store_tells_clients_nothing_of_it_and_logs_once(repository_dir, server_for, caplog):
    url = "postgresql+psycopg://secretuser@127.0.0.1:1/secretdb"
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": url, "timeout_seconds": 1},
        auth={"admin_tokens": "admin:s3cret"},
    )
    with caplog.at_level(logging.WARNING, logger="service.store"):
        with server_for(settings) as (base_url, _):
            answers = [
                loopback.post(
                    f"{base_url}/feedback", json={"items": [{"prediction_id": "0" * 12 + "f" * 20, "label": 0}]}
                )
                for _ in range(3)
            ]
            public = loopback.get(f"{base_url}/health").json()
            private = loopback.get(f"{base_url}/health", headers={"Authorization": "Bearer s3cret"}).json()
    for r in answers:
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == {
            "code": "storage_unavailable",
            "message": "the feedback store is unavailable; retry later",
        }
    assert public["status"] == "degraded" and "error" not in public["storage"]
    assert not any(secret in json.dumps(public) for secret in ("secretdb", "secretuser", "127.0.0.1"))
    assert private["storage"]["error"]
    outages = [r for r in caplog.records if r.getMessage().startswith("database unavailable")]
    assert len(outages) == 1, [r.getMessage() for r in outages]
