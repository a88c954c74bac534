"""Feedback, rolling calibration and alarms, on SQLite and on the real PostgreSQL."""

import time

import numpy as np
import pytest
import sqlalchemy as sa

from bench.common import loopback
from calibkit import metrics
from calibkit.alarms import AlarmPolicy
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import apply_temperature, softmax
from service.ports import free_port
from service.schemas import ActivateResponse, HistoryResponse, RecalibrateResponse, TimelineResponse
from service.settings import Settings
from service.store import Store
from service.store.rows import PredictionRow, encode_rows, prediction_ids
from service.store.schema import labels as label_table
from training.data import load_digits_splits

DIGITS = load_digits_splits()


@pytest.fixture
def monitored(repository_dir, server_for, database_url):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": database_url},
        auth={"admin_tokens": "admin:s3cret"},
        monitoring={"bootstrap_resamples": 300},
    )
    with server_for(settings) as (base_url, app):
        yield base_url, app


def _predict(base_url, x, **extra):
    r = loopback.post(f"{base_url}/predict", json={"inputs": x.tolist(), **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_feedback_joins_predictions_and_calibration_equals_the_core(monitored):
    base_url, _ = monitored
    x, y = DIGITS.test.x[:120], DIGITS.test.y[:120]
    body = _predict(base_url, x)
    ids = [p["id"] for p in body["predictions"]]
    items = [
        {"prediction_id": i, "label": int(label) if k % 2 else str(label)} for k, (i, label) in enumerate(zip(ids, y))
    ]
    r = loopback.post(f"{base_url}/feedback", json={"items": items})
    assert r.status_code == 200 and r.json() == {"accepted": 120, "pending": [], "rejected": []}
    report = loopback.get(f"{base_url}/calibration", params={"window": "1000"}).json()
    probs = np.array([p["probabilities"] for p in body["predictions"]])
    assert report["n"] == 120 and report["calibration_version"] == 0
    assert report["ece"] == pytest.approx(metrics.ece(probs, y), abs=1e-6)
    assert report["mce"] == pytest.approx(metrics.mce(probs, y), abs=1e-6)
    assert report["adaptive_ece"] == pytest.approx(metrics.adaptive_ece(probs, y), abs=1e-6)
    assert report["classwise_ece"] == pytest.approx(metrics.classwise_ece(probs, y), abs=1e-6)
    assert report["accuracy"] == pytest.approx(metrics.accuracy(probs, y))
    assert report["nll"] == pytest.approx(metrics.nll(probs, y), abs=1e-5)
    assert report["brier"] == pytest.approx(metrics.brier(probs, y), abs=1e-5)
    assert report["mean_confidence"] == pytest.approx(probs.max(1).mean(), abs=1e-6)
    lo, hi = report["ece_ci"]
    assert 0 <= lo <= hi and report["ece_ci_level"] == 0.9
    assert [b["count"] for b in report["bins"]] == list(metrics.reliability_bins(probs, y).count)
    assert report["reference"]["n"] == 359 and report["alarm"]["state"] in {"ok", "warning"}
    assert report["recalibration"]["temperature"] > 0 and report["drift"]["recent_predictions"] == 120
    assert loopback.get(f"{base_url}/calibration", params={"window": "10"}).json()["n"] == 10
    assert loopback.get(f"{base_url}/calibration", params={"window": "1h"}).json()["n"] == 120
    assert loopback.get(f"{base_url}/calibration", params={"window": "1s", "model": "toy"}).json()["n"] == 0


def test_bad_feedback_is_rejected_per_item_and_never_corrupts(monitored):
    base_url, _ = monitored
    ids = [p["id"] for p in _predict(base_url, DIGITS.test.x[:3])["predictions"]]
    items = [
        {"prediction_id": ids[0], "label": 3},
        {"prediction_id": "f" * 32, "label": 1},
        {"prediction_id": ids[1], "label": "eleven"},
        {"prediction_id": ids[1], "label": 10},
        {"prediction_id": ids[0], "label": 4},
        {"probabilities": [0.1] * 10, "label": 2},
        {"probabilities": [0.5, 0.5], "label": 0},
        {"probabilities": [0.2, 0.3, 0.5], "label": "c", "model": "toy"},
        {"probabilities": [0.2] * 10, "label": 1},
        {"probabilities": [-0.5, 1.5] + [0.0] * 8, "label": 1},
    ]
    r = loopback.post(f"{base_url}/feedback", json={"items": items})
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 3
    reasons = {item["index"]: item["reason"] for item in body["rejected"]}
    assert "unknown prediction id" in reasons[1]
    assert "'eleven' is not a class" in reasons[2]
    assert "not a class index" in reasons[3] and "0..9" in reasons[3]
    assert "duplicate feedback for this prediction id in this request" in reasons[4]
    assert "has 2 values; model digits-lenet5 has 10 classes" in reasons[6]
    assert "must sum to 1" in reasons[8] and "sums to 2" in reasons[8]
    assert "must lie in [0, 1]" in reasons[9]
    again = loopback.post(f"{base_url}/feedback", json={"items": [{"prediction_id": ids[0], "label": 3}]}).json()
    assert again["accepted"] == 0 and "already has a label" in again["rejected"][0]["reason"]
    assert loopback.get(f"{base_url}/calibration").json()["n"] == 2  # the offline item went to 'toy'
    for payload, status, field in [
        ({"items": []}, 422, "items"),
        ({"items": [{"label": 1}]}, 422, "items[0]"),
        ({"items": [{"prediction_id": ids[2], "label": True}]}, 422, "items[0].label"),
        ({"items": [{"prediction_id": ids[2], "probabilities": [1.0], "label": 1}]}, 422, "items[0]"),
        ({"items": [{"prediction_id": ids[2], "label": 1}] * 10001}, 422, "items"),
    ]:
        r = loopback.post(f"{base_url}/feedback", json=payload)
        assert r.status_code == status and r.json()["error"]["field"] == field, r.text
    r = loopback.post(f"{base_url}/feedback", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert loopback.get(f"{base_url}/calibration").json()["n"] == 2
    assert loopback.get(f"{base_url}/calibration", params={"window": "soon"}).status_code == 422


def _offline(z, y, scale):
    return [
        {"probabilities": p.tolist(), "label": int(label), "model": "digits-lenet5"}
        for p, label in zip(softmax(scale * z), y)
    ]


def test_shift_raises_the_alarm_everywhere_and_recalibration_is_reversible(
    repository_dir, server_for, database_url, evaluate_now, webhook
):
    # the alarm is evaluated after every batch, here by the test, as the old per-request evaluation did
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        alarm=AlarmPolicy(min_labels=200),
        store={"url": database_url},
        auth={"admin_tokens": "admin:s3cret"},
        monitoring={
            "bootstrap_resamples": 300,
            "webhook_url": webhook.url,
            "evaluate_seconds": 3600,
            "evaluate_every_labels": 10**9,
        },
    )
    z, y = calibrated_logits(1400, n_classes=10, logit_scale=8.0, seed=5)
    with server_for(settings) as (base_url, app):
        calm = loopback.post(f"{base_url}/feedback", json={"items": _offline(z[:600], y[:600], 1.0)}).json()
        assert calm["accepted"] == 600
        evaluate_now(app)
        assert loopback.get(f"{base_url}/calibration").json()["alarm"]["state"] != "alarm"
        states = []
        for start in range(600, 1400, 100):
            loopback.post(
                f"{base_url}/feedback", json={"items": _offline(z[start : start + 100], y[start : start + 100], 2.5)}
            )
            evaluate_now(app)
            states.append(loopback.get(f"{base_url}/calibration").json()["alarm"]["state"])
        report = loopback.get(f"{base_url}/calibration").json()
        assert report["alarm"]["state"] == "alarm" and states.index("alarm") <= 4, states
        assert any("e-detector" in r for r in report["alarm"]["reasons"])
        text = loopback.get(f"{base_url}/metrics").text
        assert 'calib_alarm_state{model="digits-lenet5",version="1"} 2.0' in text
        assert 'calib_labeled_total{bin="14",model="digits-lenet5",version="1"}' in text
        history = loopback.get(f"{base_url}/calibration/history").json()
        assert history["alarm_events"][0]["from"] in ("ok", "warning") and history["alarm_events"][0]["to"] == "alarm"
        assert HistoryResponse.model_validate(history).alarm_events[0].to_state == "alarm"
        png = loopback.get(f"{base_url}/calibration/reliability.png")
        assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"

        # admin: refused without the token, then a refit from online predictions with logits
        assert loopback.post(f"{base_url}/admin/recalibrate", json={}).status_code == 401
        assert (
            loopback.post(
                f"{base_url}/admin/recalibrate", json={}, headers={"Authorization": "Bearer nope"}
            ).status_code
            == 401
        )
        auth = {"Authorization": "Bearer s3cret"}
        too_few = loopback.post(f"{base_url}/admin/recalibrate", json={}, headers=auth)
        assert too_few.status_code == 422 and "need at least 50" in too_few.json()["error"]["message"]
        x, labels = DIGITS.test.x[:200], DIGITS.test.y[:200]
        hot = loopback.post(f"{base_url}/predict", json={"inputs": (x * 1.0).tolist()}).json()
        loopback.post(
            f"{base_url}/feedback",
            json={"items": [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(hot["predictions"], labels)]},
        )
        refit = loopback.post(f"{base_url}/admin/recalibrate", json={"window": "200"}, headers=auth)
        assert refit.status_code == 200, refit.text
        new_t = refit.json()["temperature"]
        assert RecalibrateResponse.model_validate(refit.json()).calibration_version == 1
        assert set(refit.json()) == set(RecalibrateResponse.model_fields)
        after = _predict(base_url, x[:5], return_logits=True)
        assert after["calibration_version"] == 1 and after["temperature"] == pytest.approx(new_t)
        logits = np.array([p["logits"] for p in after["predictions"]])
        probs = np.array([p["probabilities"] for p in after["predictions"]])
        np.testing.assert_allclose(probs, apply_temperature(logits, new_t), atol=1e-6)
        v2 = loopback.post(
            f"{base_url}/v2/models/digits-lenet5/infer",
            json={  # the same refit over v2
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": list(x[:5].shape),
                        "data": np.asarray(x[:5], np.float32).ravel().tolist(),
                    }
                ],
                "outputs": [{"name": "probabilities"}],
            },
        ).json()
        np.testing.assert_allclose(np.reshape(v2["outputs"][0]["data"], probs.shape), probs, atol=1e-6)
        assert loopback.get(f"{base_url}/calibration").json()["calibration_version"] == 1
        back = loopback.post(f"{base_url}/admin/calibration/activate", json={"calibration_version": 0}, headers=auth)
        assert (
            back.json()
            == ActivateResponse(
                model="digits-lenet5", version="1", calibration_version=0, temperature=back.json()["temperature"]
            ).model_dump()
        )
        assert _predict(base_url, x[:1])["calibration_version"] == 0
        versions = loopback.get(f"{base_url}/calibration/history").json()["calibrations"]
        assert [(v["calibration_version"], v["source"], v["active"]) for v in versions] == [
            (0, "manifest", True),
            (1, "refit", False),
        ]
        missing = loopback.post(f"{base_url}/admin/calibration/activate", json={"calibration_version": 7}, headers=auth)
        assert missing.status_code == 404
    assert any(event["to"] == "alarm" and event["model"] == "digits-lenet5" for event in webhook.received)


def test_calibration_says_how_many_labels_the_alarm_state_rests_on(
    repository_dir, server_for, database_url, evaluate_now
):
    # the alarm is re-assessed by a background pass: until it runs, stored labels are pending, not in the state
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": database_url},
        monitoring={"bootstrap_resamples": 300, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
    )
    z, y = calibrated_logits(300, n_classes=10, logit_scale=8.0, seed=6)
    with server_for(settings) as (base_url, app):
        before = loopback.get(f"{base_url}/calibration").json()["e_detector"]
        assert (before["labels_seen"], before["labels_stored"], before["labels_pending"]) == (0, 0, 0)
        assert before["newest_folded_labelled_at"] is None
        loopback.post(f"{base_url}/feedback", json={"items": _offline(z[:200], y[:200], 1.0)}).raise_for_status()
        waiting = loopback.get(f"{base_url}/calibration").json()["e_detector"]
        assert (waiting["labels_seen"], waiting["labels_stored"], waiting["labels_pending"]) == (0, 200, 200)
        evaluate_now(app)
        loopback.post(f"{base_url}/feedback", json={"items": _offline(z[200:], y[200:], 1.0)}).raise_for_status()
        behind = loopback.get(f"{base_url}/calibration").json()["e_detector"]
        assert (behind["labels_seen"], behind["labels_stored"], behind["labels_pending"]) == (200, 300, 100)
        assert behind["newest_folded_labelled_at"] == pytest.approx(time.time(), abs=60)
        evaluate_now(app)
        caught_up = loopback.get(f"{base_url}/calibration").json()["e_detector"]
        assert (caught_up["labels_seen"], caught_up["labels_stored"], caught_up["labels_pending"]) == (300, 300, 0)


def test_admin_is_off_without_a_token(base_url):
    r = loopback.post(f"{base_url}/admin/recalibrate", json={})
    assert r.status_code == 403 and "CALIB_AUTH__ADMIN_TOKENS" in r.json()["error"]["message"]


def test_timeline_is_the_rolling_window_ece(monitored):
    base_url, _ = monitored
    z, y = calibrated_logits(300, n_classes=10, logit_scale=8.0, seed=9)
    loopback.post(f"{base_url}/feedback", json={"items": _offline(z, y, 1.0)})
    body = loopback.get(f"{base_url}/calibration/timeline", params={"window": 100, "step": 50, "points": 4}).json()
    points = body["points"]
    assert TimelineResponse.model_validate(body).window == 100 and set(points[0]) == {
        "seq",
        "labelled_at",
        "n",
        "ece",
        "ece_ci",
    }
    assert [p["n"] for p in points] == [100, 100, 100, 100] and len(points) == 4
    assert points[-1]["ece"] == pytest.approx(metrics.ece(softmax(z[-100:]), y[-100:]), abs=1e-9)
    assert points[0]["ece"] == pytest.approx(metrics.ece(softmax(z[50:150]), y[50:150]), abs=1e-9)
    assert all(p["ece_ci"][0] <= p["ece_ci"][1] for p in points)
    assert loopback.get(f"{base_url}/calibration/timeline", params={"window": 5}).status_code == 422


def _assert_bin_counters_at_zero(base_url):
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(loopback.get(f"{base_url}/metrics").text)}
    for name in ("calib_labeled", "calib_confidence_sum", "calib_correct"):
        samples = [
            s
            for s in families[name].samples
            if s.name.endswith("_total") and s.labels["model"] == "digits-lenet5" and s.labels["version"] == "1"
        ]
        assert sorted(int(s.labels["bin"]) for s in samples) == list(range(15))
        assert all(s.value == 0 for s in samples)


def test_bin_counters_are_exported_at_zero_before_any_label(monitored):
    """Prometheus' increase() counts from a series' first scrape: every bin's series exists from the start."""
    base_url, _ = monitored
    _assert_bin_counters_at_zero(base_url)


def test_bin_counters_are_exported_even_when_the_store_is_down_at_start(repository_dir, server_for):
    """The counters live in the process: a store that cannot be reached at start-up does not hold them back."""
    port = free_port()  # a port nobody listens on
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"},
    )
    with server_for(settings) as (base_url, _):
        assert loopback.get(f"{base_url}/health").json()["storage"]["up"] is False
        _assert_bin_counters_at_zero(base_url)


@pytest.mark.parametrize(
    "path, method, model",
    [
        ("/calibration/timeline", "get", "TimelineResponse"),
        ("/calibration/history", "get", "HistoryResponse"),
        ("/admin/recalibrate", "post", "RecalibrateResponse"),
        ("/admin/calibration/activate", "post", "ActivateResponse"),
    ],
)
def test_monitoring_responses_are_typed_in_the_openapi_document(base_url, path, method, model):
    document = loopback.get(f"{base_url}/openapi.json").json()
    ok = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": f"#/components/schemas/{model}"}
    assert document["components"]["schemas"][model]["properties"]


def _other_replica_logs(
    database_url: str, ids: list[str], model: str = "digits-lenet5", version: str = "1", k: int = 10
) -> None:
    """Another replica writes the predictions ``ids`` to the shared store (its prediction log), as it would
    after answering them."""
    probs = softmax(np.random.default_rng(len(ids)).normal(size=(len(ids), k)) * 3)
    rows = [
        PredictionRow(i, model, version, 0, time.time(), int(p.argmax()), float(p.max()), None, blob, None)
        for i, p, blob in zip(ids, probs, encode_rows(probs))
    ]
    other = Store(database_url)
    other.predictions.insert(rows)
    other.db.engine.dispose()


def _until(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def _labelled_in_order(database_url: str) -> list[str]:
    store = Store(database_url)
    try:
        query = sa.select(label_table.c.prediction_id).order_by(label_table.c.seq)
        return store.db.run(lambda c: list(c.execute(query).scalars()), write=False)
    finally:
        store.db.engine.dispose()


def test_a_label_sent_before_its_prediction_is_stored_waits_and_joins_in_arrival_order(monitored, database_url):
    base_url, _ = monitored
    ids = prediction_ids(3)
    n_before = loopback.get(f"{base_url}/calibration").json()["n"]
    items = [
        {"prediction_id": ids[0], "label": 3},
        {"prediction_id": ids[1], "label": "7"},
        {"prediction_id": ids[2], "label": 2},
    ]
    body = loopback.post(f"{base_url}/feedback", json={"items": items}).json()
    assert body == {
        "accepted": 0,
        "pending": [{"index": k, "prediction_id": i} for k, i in enumerate(ids)],
        "rejected": [],
    }
    again = loopback.post(f"{base_url}/feedback", json={"items": [{"prediction_id": ids[0], "label": 5}]}).json()
    assert again["pending"] == [] and "already has a pending label" in again["rejected"][0]["reason"]
    unmatched = loopback.get(f"{base_url}/feedback/unmatched").json()
    assert unmatched["pending"] == 3 and [i["prediction_id"] for i in unmatched["items"]] == ids[::-1]
    assert loopback.get(f"{base_url}/calibration").json()["unmatched_labels"] == {
        "pending": 3,
        "expired": 0,
        "rejected": 0,
    }
    _other_replica_logs(database_url, [ids[1], ids[0]])  # written in another order than the labels came
    _until(lambda: loopback.get(f"{base_url}/feedback/unmatched").json()["pending"] == 1)
    assert _labelled_in_order(database_url)[-2:] == ids[:2]  # joined in the order the labels arrived
    assert loopback.get(f"{base_url}/calibration").json()["n"] == n_before + 2
    metrics_text = loopback.get(f"{base_url}/metrics").text
    assert 'calib_pending_labels_resolved_total{outcome="joined"} 2.0' in metrics_text
    assert 'calib_feedback_items_total{result="pending"} 3.0' in metrics_text


def test_labels_that_can_never_join_are_rejected_at_once_and_late_ones_expire_listed(
    repository_dir, server_for, database_url
):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": database_url},
        # 3 s pending: another replica's store is opened and written inside that window (over a second when loaded)
        labels={"pending_seconds": 3.0, "join_seconds": 0.1},
    )
    with server_for(settings) as (base_url, _):
        ids = prediction_ids(3)
        old = f"{int((time.time() - 40 * 86400) * 1000):012x}" + "0" * 20
        items = [
            {"prediction_id": "nope", "label": 1},
            {"prediction_id": "f" * 32, "label": 1},
            {"prediction_id": old, "label": 1},
            {"prediction_id": ids[0], "label": "eleven"},
            {"prediction_id": ids[0], "label": 9},
            {"prediction_id": ids[1], "label": 9},
            {"prediction_id": ids[2], "label": 4},
        ]
        body = loopback.post(f"{base_url}/feedback", json={"items": items}).json()
        reasons = {r["index"]: r["reason"] for r in body["rejected"]}
        assert sorted(reasons) == [0, 1, 2, 3] and [p["index"] for p in body["pending"]] == [4, 5, 6]
        assert "not a prediction id" in reasons[0] and "in the future" in reasons[1]
        assert "beyond the retention period" in reasons[2]
        assert "'eleven' is not a class of any served model" in reasons[3]
        # ids[1] turns out to be a prediction of 'toy' (classes a, b, c): label 9 is refused at the join
        _other_replica_logs(database_url, [ids[1]], model="toy", version="1", k=3)
        unmatched = _until(lambda: (u := loopback.get(f"{base_url}/feedback/unmatched").json())["pending"] == 0 and u)
        by_id = {i["prediction_id"]: i for i in unmatched["items"]}
        assert by_id[ids[1]]["status"] == "rejected" and "not a class index of model toy" in by_id[ids[1]]["reason"]
        assert by_id[ids[0]]["status"] == by_id[ids[2]]["status"] == "expired"
        assert "no prediction with this id within 3 s" in by_id[ids[0]]["reason"]
        assert unmatched["expired"] == 2 and unmatched["rejected"] == 1
        expired_only = loopback.get(f"{base_url}/feedback/unmatched", params={"status": "expired"}).json()["items"]
        assert {i["prediction_id"] for i in expired_only} == {ids[0], ids[2]}
        metrics_text = loopback.get(f"{base_url}/metrics").text
        assert 'calib_pending_labels_resolved_total{outcome="expired"} 2.0' in metrics_text
        assert 'calib_pending_labels_resolved_total{outcome="rejected"} 1.0' in metrics_text
        # the prediction arrives after its label expired: nothing joins by itself, and the label sent again counts
        _other_replica_logs(database_url, [ids[2]])
        assert (
            loopback.post(f"{base_url}/feedback", json={"items": [{"prediction_id": ids[2], "label": 4}]}).json()[
                "accepted"
            ]
            == 1
        )
        assert loopback.get(f"{base_url}/feedback/unmatched", params={"limit": 0}).json() == {
            "pending": 0,
            "expired": 2,
            "rejected": 1,
            "items": [],
        }
        for params, field in [({"status": "lost"}, "status"), ({"limit": -1}, "limit")]:
            r = loopback.get(f"{base_url}/feedback/unmatched", params=params)
            assert r.status_code == 422 and field in r.text
