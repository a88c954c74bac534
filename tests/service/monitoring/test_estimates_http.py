"""drift.estimated of GET /calibration, end to end over HTTP: label-shifted digits sent to /predict, the estimates read
before any label, then the labels sent late and in batches, and every figure checked against what the client itself
received (the served probabilities) and sent (the labels)."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from bench.common import loopback
from calibkit.estimated_accuracy import accuracy_interval
from calibkit.label_shift import em_priors
from calibkit.manifest import load_manifest
from service.settings import Settings
from tests.service.conftest import DEFAULT_ARTIFACT, flush_prediction_log
from training.data import load_digits_splits

MODEL = "digits-lenet5"
ROWS = 1000
CHECK = 250
#: The traffic's class priors: three classes take 70% of it (the validation split is near uniform).
PRIORS = np.array([0.3, 0.25, 0.15] + [0.3 / 7] * 7)


@pytest.fixture(scope="module")
def shifted_artifact(tmp_path_factory):
    """The committed default artifact, whose manifest carries the validation priors (``label_shift``) and whose
    conformal file the per-class scores."""
    root = tmp_path_factory.mktemp("shift-artifacts")
    shutil.copytree(DEFAULT_ARTIFACT, root / MODEL / "1")
    assert load_manifest(root / MODEL / "1" / "manifest.json").label_shift is not None
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
            r = loopback.post(
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

        alarm = loopback.get(f"{base_url}/calibration", timeout=30).json()["label_shift"]
        assert alarm["available"] and alarm["state"] == "alarm" and alarm["predictions"] == ROWS, alarm
        assert alarm["driver"] == {"class": "0", "side": "up"}  # the class the traffic moved most
        moved = next(c for c in alarm["classes"] if c["class"] == "0")
        assert moved["mean_since"] is not None and moved["reference"] + 0.1 < probs[:, 0].mean()
        assert alarm["raises"] == 1 and alarm["threshold"] == 1e6 and alarm["changed_at"] is not None

        metrics = loopback.get(f"{base_url}/metrics", timeout=30).text
        assert f'calib_label_shift_alarm{{model="{MODEL}",version="1"}} 1.0' in metrics
        assert f'calib_estimated_accuracy{{model="{MODEL}",version="1"}}' in metrics
        assert f'calib_accuracy_floor{{model="{MODEL}",version="1"}} 0.99' in metrics
        assert f'calib_estimated_prior{{class_name="0",model="{MODEL}",version="1"}}' in metrics

        # the labels come late, in batches, oldest first, with a pass of the evaluator after each
        order = np.arange(ROWS)
        for batch in np.array_split(order, 4):
            items = [{"prediction_id": served[i]["id"], "label": int(labels[i])} for i in batch]
            r = loopback.post(f"{base_url}/feedback", json={"items": items}, timeout=30)
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
    r = loopback.get(f"{base_url}/calibration", timeout=30)
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
            shift={"check_labels": 100, "prior_resamples": 100, "settle_seconds": 0, "adapt": "always"},
        )

    with running_server(settings()) as (url_a, app_a), running_server(settings()) as (url_b, app_b):
        r = loopback.post(f"{url_a}/predict", json={"inputs": test.x[rows].tolist()}, timeout=30)
        assert r.status_code == 200, r.text
        served = r.json()["predictions"]
        deadline = time.monotonic() + 30
        while _estimated(url_b)["n"] < len(rows):
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        items = [{"prediction_id": p["id"], "label": int(y)} for p, y in zip(served[:300], labels[:300])]
        assert loopback.post(f"{url_b}/feedback", json={"items": items}, timeout=30).status_code == 200
        evaluate_now(app_a)
        evaluate_now(app_b)
        a, b = _estimated(url_a), _estimated(url_b)
        assert a == b
        assert a["labelled"]["n"] == 300 and a["interval_checks"]["windows"] == 3
        assert a["priors"]["em"]["lower"] is not None
        shift_a, shift_b = (loopback.get(f"{u}/calibration", timeout=30).json()["label_shift"] for u in (url_a, url_b))
        assert shift_a == shift_b and shift_a["predictions"] == len(rows)
        # both serve the same adaptation: the same priors' version, the same probabilities and sets, bit for bit
        answers = [
            loopback.post(f"{u}/predict", json={"inputs": test.x[:20].tolist()}, timeout=30).json()
            for u in (url_a, url_b)
        ]
        assert answers[0]["priors_version"] == answers[1]["priors_version"] == shift_a["served_priors"]["version"]
        for key in ("probabilities", "prediction_set", "confidence", "label"):
            assert [p[key] for p in answers[0]["predictions"]] == [p[key] for p in answers[1]["predictions"]]
        # a front-end that runs no evaluation (a pod's others) serves the stored priors from its refresh pass
        served_b = app_b.state.parts.repository.get(MODEL, "1")
        served_b.adaptation = None
        app_b.state.parts.monitor.sync()
        assert served_b.adaptation is not None and served_b.adaptation.version == answers[0]["priors_version"]


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
        assert loopback.post(f"{base_url}/predict", json={"inputs": test.x.tolist()}, timeout=30).status_code == 200
        deadline = time.monotonic() + 30
        while _estimated(base_url)["n"] < len(test.y):
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        evaluate_now(app)
        report = loopback.get(f"{base_url}/calibration", timeout=30).json()
        assert report["label_shift"]["state"] == "ok" and report["label_shift"]["predictions"] == len(test.y)
        assert report["label_shift"]["statistic"] < 10
        assert report["drift"]["estimated"]["priors"]["total_variation"] < 0.1


def _nll(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)).mean())


def test_a_label_shift_is_corrected_once_the_alarm_is_raised(shifted_artifact, tmp_path, evaluate_now):
    """CALIB_SHIFT__ADAPT=alarm: the first shifted traffic is served as the model gives it; once the label-shift
    alarm is raised (no label sent), the responses carry adapted probabilities and weighted sets with the priors'
    version, and the client, holding the true labels, measures that they fit the traffic better."""
    from tests.service.conftest import running_server

    test = load_digits_splits().test
    rng = np.random.default_rng(5656)
    settings = Settings(
        artifacts=shifted_artifact,
        default_model=MODEL,
        store={"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
        monitoring={"drift_rows": ROWS, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        # A = 1e4: this test is of the adaptation that follows the alarm, not of the alarm's power (tested above)
        shift={"adapt": "alarm", "settle_seconds": 0, "alarm_threshold": 1e4},
    )

    def shifted(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.choice(10, size=n, p=PRIORS)
        return test.x[[rng.choice(np.flatnonzero(test.y == k)) for k in labels]], labels

    def predict(base_url: str, x: np.ndarray, **options) -> list[dict]:
        bodies = []
        for start in range(0, len(x), 100):
            r = loopback.post(
                f"{base_url}/predict", json={"inputs": x[start : start + 100].tolist(), **options}, timeout=30
            )
            assert r.status_code == 200, r.text
            bodies.append(r.json())
        return bodies

    with running_server(settings) as (base_url, app):
        r = loopback.post(f"{base_url}/predict", json={"inputs": test.x[:2].tolist(), "adapt_priors": True}, timeout=30)
        assert r.status_code == 422 and r.json()["error"]["field"] == "adapt_priors", r.text  # no priors yet

        x, _ = shifted(ROWS)
        assert all(body["priors_version"] is None for body in predict(base_url, x))  # no alarm yet: as the model says
        deadline = time.monotonic() + 30
        while _estimated(base_url)["n"] < ROWS:
            assert time.monotonic() < deadline, "the predictions were not logged"
            time.sleep(0.2)
        evaluate_now(app)
        report = loopback.get(f"{base_url}/calibration", timeout=30).json()
        alarm = report["label_shift"]
        assert alarm["state"] == "alarm" and alarm["served_priors"] is not None
        version = alarm["served_priors"]["version"]
        weights = np.array(list(alarm["served_priors"]["weights"].values()))
        assert version == report["drift"]["estimated"]["priors"]["version"] == f"em:{ROWS}:{version.split(':')[2]}"

        x, labels = shifted(ROWS)
        adapted_bodies = predict(base_url, x)
        own_bodies = predict(base_url, x, adapt_priors=False)
        assert {body["priors_version"] for body in adapted_bodies} == {version}
        assert {body["priors_version"] for body in own_bodies} == {None}
        adapted_rows = [p for body in adapted_bodies for p in body["predictions"]]
        own_rows = [p for body in own_bodies for p in body["predictions"]]
        adapted_probs = np.array([p["probabilities"] for p in adapted_rows])
        own_probs = np.array([p["probabilities"] for p in own_rows])
        expected = weights * own_probs
        np.testing.assert_allclose(adapted_probs, expected / expected.sum(axis=1, keepdims=True), atol=1e-6)
        assert _nll(adapted_probs, labels) < _nll(own_probs, labels)  # corrected: closer to the traffic
        assert (adapted_probs.argmax(axis=1) == labels).mean() >= (own_probs.argmax(axis=1) == labels).mean() - 0.005

        # the sets: weighted (Podkopaev & Ramdas 2021), named by the priors' version, still covering the target
        info = adapted_bodies[0]["conformal"]
        assert info["threshold_version"].endswith(f"priors={version}") and info["threshold"] is None
        covered = np.mean([str(y) in p["prediction_set"] for p, y in zip(adapted_rows, labels)])
        assert covered >= info["coverage"] - 0.03, covered

        # the prediction log keeps the model's own probabilities and the version of the rows served adapted
        store = app.state.parts.monitor.reports.store
        flush_prediction_log(app)
        logged = store.predictions.fetch([p["id"] for p in adapted_rows[:50]])
        assert {row.priors_version for row in logged.values()} == {version}
        np.testing.assert_allclose(
            np.frombuffer(logged[adapted_rows[0]["id"]].probabilities, np.float32), own_probs[0], atol=1e-6
        )

        # the Open Inference Protocol too, by its request parameter
        tensor = {"name": "input", "shape": [5, 1, 8, 8], "datatype": "FP32", "data": x[:5].ravel().tolist()}
        v2 = f"{base_url}/v2/models/{MODEL}/infer"
        r = loopback.post(v2, json={"inputs": [tensor], "parameters": {"adapt_priors": True}}, timeout=30)
        assert r.status_code == 200 and r.json()["parameters"]["priors_version"] == version, r.text
        answered = next(o for o in r.json()["outputs"] if o["name"] == "probabilities")
        np.testing.assert_allclose(np.reshape(answered["data"], (5, 10)), adapted_probs[:5], atol=1e-6)
        r = loopback.post(v2, json={"inputs": [tensor], "parameters": {"adapt_priors": "yes"}}, timeout=30)
        assert r.status_code == 400 and "parameters.adapt_priors" in r.text, r.text

        est = _estimated(base_url)["adapted"]  # the estimate recomputed from the adapted probabilities
        assert est["priors_version"] == version and 0 < est["accuracy"]["lower"] <= est["accuracy"]["upper"] <= 1
