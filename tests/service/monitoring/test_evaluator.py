"""Alarm evaluation off the request path: on a cadence, after enough labels, for labels stored by other
replicas, and through a store outage."""

import logging
import time

import numpy as np
import pytest

from bench.common import loopback
from calibkit import binning, metrics
from calibkit.alarms import AlarmPolicy
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.settings import Settings
from service.store import Store
from service.store.rows import LabelRow, PredictionRow, encode_rows, prediction_ids
from tests.waiting import wait_for

MODEL = "digits-lenet5"
SERVED = {(MODEL, "1"), ("toy", "1"), ("toy", "2")}


def _offline(n, seed, scale=1.0):
    z, y = calibrated_logits(n, n_classes=10, logit_scale=8.0, seed=seed)
    return [{"probabilities": p.tolist(), "label": int(t), "model": MODEL} for p, t in zip(softmax(scale * z), y)]


def _count_assessments(app) -> list:
    """Record every ``Monitor.assess`` call of ``app`` (model, version)."""
    monitor, calls = app.state.parts.monitor, []
    assess = monitor.assess

    def counted(name, version):
        calls.append((name, version))
        return assess(name, version)

    monitor.assess = counted
    return calls


def test_neither_feedback_nor_reports_evaluate_until_enough_labels_arrive(
    repository_dir, server_for, tmp_path, evaluate_now
):
    settings = Settings(
        artifacts=repository_dir,
        default_model=MODEL,
        store={"url": f"sqlite:///{tmp_path / 'e.db'}"},
        monitoring={"bootstrap_resamples": 300, "evaluate_seconds": 3600, "evaluate_every_labels": 100},
    )
    with server_for(settings) as (base_url, app):
        calls = _count_assessments(app)
        items = _offline(100, seed=1)
        assert loopback.post(f"{base_url}/feedback", json={"items": items[:99]}).json()["accepted"] == 99
        for window in (None, "1000", "1h"):
            assert (
                loopback.get(f"{base_url}/calibration", params={"window": window} if window else {}).status_code == 200
            )
        time.sleep(0.3)
        assert calls == []
        assert loopback.post(f"{base_url}/feedback", json={"items": items[99:]}).json()["accepted"] == 1
        wait_for(lambda: len(calls) >= len(SERVED), 20, "the evaluation that 100 new labels start")
        assert set(calls) == SERVED
        done = len(calls)
        evaluate_now(app)
        assert len(calls) == done + len(SERVED)


def _store_labels(url: str, probs: np.ndarray, y: np.ndarray) -> None:
    """Store labelled offline predictions of the default model the way another replica's feedback does."""
    storage = Store(url)
    n = len(y)
    predicted = probs.argmax(1)
    confidence = probs[np.arange(n), predicted]
    bins = binning.bin_index(confidence, binning.equal_width_edges(15)).tolist()
    nll, brier = metrics.nll_terms(probs, y).tolist(), metrics.brier_terms(probs, y).tolist()
    blobs, now = encode_rows(probs), time.time()
    predictions, rows = [], []
    for i, (id_, blob) in enumerate(zip(prediction_ids(n), blobs)):
        predictions.append(
            PredictionRow(id_, MODEL, "1", 0, now, int(predicted[i]), float(confidence[i]), None, blob, None, "offline")
        )
        rows.append(
            LabelRow(
                id_,
                MODEL,
                "1",
                0,
                int(y[i]),
                int(predicted[i] == y[i]),
                float(confidence[i]),
                bins[i],
                nll[i],
                brier[i],
                now,
                blob,
            )
        )
    storage.labels.insert(rows, predictions)
    storage.db.engine.dispose()


def test_labels_stored_by_another_replica_are_evaluated_on_the_cadence_and_reach_the_webhook(
    repository_dir, server_for, database_url, webhook
):
    settings = Settings(
        artifacts=repository_dir,
        default_model=MODEL,
        alarm=AlarmPolicy(min_labels=200),
        store={"url": database_url},
        monitoring={
            "bootstrap_resamples": 300,
            "webhook_url": webhook.url,
            "evaluate_seconds": 0.2,
            "evaluate_every_labels": 10**9,
        },
    )
    z, y = calibrated_logits(1200, n_classes=10, logit_scale=8.0, seed=5)
    with server_for(settings) as (base_url, _):
        _store_labels(database_url, softmax(z[:400]), y[:400])
        _store_labels(database_url, softmax(2.5 * z[400:]), y[400:])
        wait_for(lambda: webhook.received, 30, "an alarm transition at the webhook")  # no request sent
        assert all(
            e["event"] == "calibration_alarm_transition" and (e["model"], e["version"]) == (MODEL, "1")
            for e in webhook.received
        )
        assert webhook.received[0]["from"] == "ok" and webhook.received[0]["to"] in {"warning", "alarm"}

        def report_agrees():
            state = loopback.get(f"{base_url}/calibration").json()["alarm"]["state"]
            return state == webhook.received[-1]["to"]

        wait_for(report_agrees, 20, "the report to show the last transition")


@pytest.mark.e2e  # needs PostgreSQL
def test_a_store_outage_is_logged_once_and_evaluation_resumes(
    repository_dir, server_for, pg_url, cuttable_proxy, caplog
):
    settings = Settings(
        artifacts=repository_dir,
        default_model=MODEL,
        monitoring={"bootstrap_resamples": 300, "evaluate_seconds": 0.05},
        store={"url": cuttable_proxy.database_url},
    )
    with caplog.at_level(logging.INFO, logger="service.monitoring.evaluator"), server_for(settings) as (base_url, app):

        def completed() -> float:
            return next(
                s.value for s in app.state.parts.metrics.evaluation.collect()[0].samples if s.name.endswith("_count")
            )

        wait_for(lambda: completed() >= 2, 20, "evaluation passes")
        cuttable_proxy.cut()
        time.sleep(2.0)
        messages = [r.getMessage() for r in caplog.records if r.name == "service.monitoring.evaluator"]
        assert sum("alarm evaluation paused" in m for m in messages) == 1, messages
        stalled = completed()
        cuttable_proxy.restore()
        wait_for(
            lambda: any("alarm evaluation resumed" in r.getMessage() for r in caplog.records),
            30,
            "the evaluator to resume",
        )
        wait_for(lambda: completed() >= stalled + 3, 20, "passes after the outage")
        assert loopback.post(f"{base_url}/feedback", json={"items": _offline(5, seed=2)}).json()["accepted"] == 5


def test_run_once_returns_the_transitions_and_sends_them(repository_dir, server_for, tmp_path, evaluate_now, webhook):
    settings = Settings(
        artifacts=repository_dir,
        default_model=MODEL,
        alarm=AlarmPolicy(min_labels=200),
        store={"url": f"sqlite:///{tmp_path / 'r.db'}"},
        monitoring={
            "bootstrap_resamples": 300,
            "webhook_url": webhook.url,
            "evaluate_seconds": 3600,
            "evaluate_every_labels": 10**9,
        },
    )
    z, y = calibrated_logits(1000, n_classes=10, logit_scale=8.0, seed=11)
    with server_for(settings) as (base_url, app):
        transitions = []
        for start in range(0, 1000, 100):
            scale = 1.0 if start < 400 else 2.5
            items = [
                {"probabilities": p.tolist(), "label": int(t), "model": MODEL}
                for p, t in zip(softmax(scale * z[start : start + 100]), y[start : start + 100])
            ]
            assert loopback.post(f"{base_url}/feedback", json={"items": items}).status_code == 200
            transitions += evaluate_now(app)
        assert transitions and all((t["model"], t["version"]) == (MODEL, "1") for t in transitions)
        wait_for(lambda: len(webhook.received) == len(transitions), 20, "the webhooks")
        assert [e["to"] for e in webhook.received] == [t["to"] for t in transitions]
