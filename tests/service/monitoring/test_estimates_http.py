"""drift.estimated of GET /calibration, end to end over HTTP: label-shifted digits sent to /predict, the estimates read
before any label, then the labels sent late and in batches, and every figure checked against what the client itself
received (the served probabilities) and sent (the labels)."""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from calibkit.estimated_accuracy import accuracy_interval
from calibkit.label_shift import em_priors
from calibkit.manifest import LabelShiftReference, load_manifest, write_manifest
from service.settings import Settings
from tests.service.conftest import DEFAULT_ARTIFACT
from training.data import load_digits_splits

MODEL = "digits-lenet5"
ROWS = 1000
CHECK = 250
#: The traffic's class priors: three classes take 70% of it (the validation split is near uniform).
PRIORS = np.array([0.3, 0.25, 0.15] + [0.3 / 7] * 7)


@pytest.fixture(scope="module")
def shifted_artifact(tmp_path_factory):
    """The committed default artifact with the manifest's ``label_shift`` entry from its validation split."""
    root = tmp_path_factory.mktemp("shift-artifacts")
    target = root / MODEL / "1"
    shutil.copytree(DEFAULT_ARTIFACT, target)
    manifest = load_manifest(target / "manifest.json")
    validation = load_digits_splits().val
    session = ort.InferenceSession(str(target / manifest.model_file), providers=["CPUExecutionProvider"])
    probs = session.run(["probabilities"], {manifest.input.name: validation.x.astype(np.float32)})[0]
    write_manifest(
        manifest.model_copy(update={"label_shift": LabelShiftReference.from_rows(probs, validation.y)}), target
    )
    return root


def test_label_shift_is_seen_before_the_labels_and_the_interval_is_checked_with_them(
    shifted_artifact, tmp_path, evaluate_now
):
    from tests.service.conftest import running_server

    test = load_digits_splits().test
    rng = np.random.default_rng(56)
    labels = rng.choice(10, size=ROWS, p=PRIORS)
    rows = np.array([rng.choice(np.flatnonzero(test.y == k)) for k in labels])
    settings = Settings(
        artifacts=shifted_artifact,
        default_model=MODEL,
        store={"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
        monitoring={"drift_rows": ROWS, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        # A = 1e6 (1% false alarms per 10,000 predictions): the default 1e8 takes about as many predictions as
        # this test sends, and the order of a batch's rows (by id) varies from run to run
        shift={
            "check_labels": CHECK,
            "prior_resamples": 200,
            "accuracy_floor": 0.99,
            "settle_seconds": 0,
            "alarm_threshold": 1e6,
        },
    )
    with running_server(settings) as (base_url, app):
        served = []
        for start in range(0, ROWS, 100):  # the application's traffic, 100 rows per request
            r = httpx.post(
                f"{base_url}/predict", json={"inputs": test.x[rows[start : start + 100]].tolist()}, timeout=30
            )
            assert r.status_code == 200, r.text
            served += r.json()["predictions"]
        probs = np.array([p["probabilities"] for p in served])
        confidence = np.array([p["confidence"] for p in served])
        correct = np.array([p["class_index"] for p in served]) == labels

        # before any label: the estimates the client can recompute from what it received
        deadline = time.monotonic() + 30
        while (est := _estimated(base_url))["n"] < ROWS:
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        evaluate_now(app)
        est = _estimated(base_url)
        lower, upper = accuracy_interval(probs.max(axis=1), 0.95)
        assert est["accuracy"]["estimate"] == pytest.approx(confidence.mean(), abs=1e-6)
        assert (est["accuracy"]["lower"], est["accuracy"]["upper"]) == pytest.approx((lower, upper), abs=2 / ROWS)
        assert est["labelled"] is None and est["interval_checks"]["windows"] == 0
        frequencies = np.bincount(labels, minlength=10) / ROWS
        em = np.array(list(est["priors"]["em"]["priors"].values()))
        bbse = np.array(list(est["priors"]["bbse"]["priors"].values()))
        reference = np.array(list(est["priors"]["reference"].values()))
        assert np.abs(em - frequencies).sum() < 0.08, (em, frequencies)  # found without labels
        assert np.abs(bbse - frequencies).sum() < 0.15, (bbse, frequencies)
        assert est["priors"]["total_variation"] == pytest.approx(0.5 * np.abs(em - reference).sum())
        assert est["priors"]["total_variation"] > 0.3  # the shift stands out from the validation priors
        inside = [
            est["priors"]["em"]["lower"][c] <= est["priors"]["em"]["upper"][c] for c in est["priors"]["em"]["lower"]
        ]
        assert all(inside)
        assert em == pytest.approx(em_priors(probs, reference).priors, abs=1e-4)  # float32 as stored

        alarm = httpx.get(f"{base_url}/calibration", timeout=30).json()["label_shift"]
        assert alarm["available"] and alarm["state"] == "alarm" and alarm["predictions"] == ROWS, alarm
        assert alarm["driver"] == {"class": "0", "side": "up"}  # the class the traffic moved most
        moved = next(c for c in alarm["classes"] if c["class"] == "0")
        assert moved["mean_since"] is not None and moved["reference"] + 0.1 < probs[:, 0].mean()
        assert alarm["raises"] == 1 and alarm["threshold"] == 1e6 and alarm["changed_at"] is not None

        metrics = httpx.get(f"{base_url}/metrics", timeout=30).text
        assert f'calib_label_shift_alarm{{model="{MODEL}",version="1"}} 1.0' in metrics
        assert f'calib_estimated_accuracy{{model="{MODEL}",version="1"}}' in metrics
        assert f'calib_accuracy_floor{{model="{MODEL}",version="1"}} 0.99' in metrics
        assert f'calib_estimated_prior{{class_name="0",model="{MODEL}",version="1"}}' in metrics

        # the labels come late, in batches, oldest first, with a pass of the evaluator after each
        order = np.arange(ROWS)
        for batch in np.array_split(order, 4):
            items = [{"prediction_id": served[i]["id"], "label": int(labels[i])} for i in batch]
            r = httpx.post(f"{base_url}/feedback", json={"items": items}, timeout=30)
            assert r.status_code == 200 and r.json()["accepted"] == len(items), r.text
            evaluate_now(app)
        est = _estimated(base_url)
        assert est["labelled"]["n"] == ROWS
        assert est["labelled"]["realized_accuracy"] == pytest.approx(correct.mean())
        assert est["labelled"]["held"] == (lower - 2 / ROWS <= correct.mean() <= upper + 2 / ROWS)
        held = sum(
            bool(lo <= correct[b].mean() <= hi)
            for b in np.array_split(order, ROWS // CHECK)
            for lo, hi in [accuracy_interval(confidence[b], 0.95)]
        )
        checks = est["interval_checks"]
        assert (checks["windows"], checks["labels_per_check"]) == (ROWS // CHECK, CHECK)
        assert checks["held"] == held and checks["held_rate"] == held / (ROWS // CHECK)


def _estimated(base_url: str) -> dict:
    r = httpx.get(f"{base_url}/calibration", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["drift"]["estimated"]


def test_two_replicas_report_the_same_estimates_bit_for_bit(shifted_artifact, database_url, evaluate_now):
    """Predictions through one replica, labels through the other, both evaluating: the same drift.estimated,
    bootstrap intervals included, because everything is derived from the shared store in order."""
    from tests.service.conftest import running_server

    test = load_digits_splits().test
    rng = np.random.default_rng(7)
    labels = rng.choice(10, size=400, p=PRIORS)
    rows = np.array([rng.choice(np.flatnonzero(test.y == k)) for k in labels])

    def settings() -> Settings:
        return Settings(
            artifacts=shifted_artifact,
            default_model=MODEL,
            store={"url": database_url},
            monitoring={"drift_rows": 400, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
            shift={"check_labels": 100, "prior_resamples": 100, "settle_seconds": 0},
        )

    with running_server(settings()) as (url_a, app_a), running_server(settings()) as (url_b, app_b):
        r = httpx.post(f"{url_a}/predict", json={"inputs": test.x[rows].tolist()}, timeout=30)
        assert r.status_code == 200, r.text
        served = r.json()["predictions"]
        deadline = time.monotonic() + 30
        while _estimated(url_b)["n"] < len(rows):
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        items = [{"prediction_id": p["id"], "label": int(y)} for p, y in zip(served[:300], labels[:300])]
        assert httpx.post(f"{url_b}/feedback", json={"items": items}, timeout=30).status_code == 200
        evaluate_now(app_a)
        evaluate_now(app_b)
        a, b = _estimated(url_a), _estimated(url_b)
        assert a == b
        assert a["labelled"]["n"] == 300 and a["interval_checks"]["windows"] == 3
        assert a["priors"]["em"]["lower"] is not None
        shift_a, shift_b = (httpx.get(f"{u}/calibration", timeout=30).json()["label_shift"] for u in (url_a, url_b))
        assert shift_a == shift_b and shift_a["predictions"] == len(rows)


def test_unshifted_traffic_raises_no_label_shift_alarm(shifted_artifact, tmp_path, evaluate_now):
    """The test split as it comes (near the validation priors): the priors barely move, the alarm stays ok."""
    from tests.service.conftest import running_server

    test = load_digits_splits().test
    settings = Settings(
        artifacts=shifted_artifact,
        default_model=MODEL,
        store={"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
        monitoring={"drift_rows": len(test.y), "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        shift={"settle_seconds": 0},
    )
    with running_server(settings) as (base_url, app):
        assert httpx.post(f"{base_url}/predict", json={"inputs": test.x.tolist()}, timeout=30).status_code == 200
        deadline = time.monotonic() + 30
        while _estimated(base_url)["n"] < len(test.y):
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        evaluate_now(app)
        report = httpx.get(f"{base_url}/calibration", timeout=30).json()
        assert report["label_shift"]["state"] == "ok" and report["label_shift"]["predictions"] == len(test.y)
        assert report["label_shift"]["statistic"] < 10
        assert report["drift"]["estimated"]["priors"]["total_variation"] < 0.1
