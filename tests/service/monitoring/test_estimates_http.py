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
        shift={"check_labels": CHECK, "prior_resamples": 200, "accuracy_floor": 0.99},
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

        metrics = httpx.get(f"{base_url}/metrics", timeout=30).text
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
            shift={"check_labels": 100, "prior_resamples": 100},
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
