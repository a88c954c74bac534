"""Coverage of the served prediction sets, end to end over HTTP: predictions with sets on one replica, feedback
under a scripted shift on the other, and the coverage block, the coverage alarm and the adapted threshold that
both replicas derive from the shared store, identical to the bit, on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.common import loopback
from service.settings import Settings
from tests.waiting import wait_for

CLASSES = ("a", "b", "c", "d", "e")


@pytest.fixture
def artifacts(tmp_path, linear_artifact, add_conformal):
    root = tmp_path / "artifacts"
    add_conformal(linear_artifact(root, "sets", "1", classes=CLASSES, seed=3))
    return root


def settings_for(artifacts, database_url: str, monitoring: dict | None = None, **groups) -> Settings:
    fast = {"bootstrap_resamples": 200, "evaluate_seconds": 0.2, "evaluate_every_labels": 50}
    return Settings(
        artifacts=artifacts,
        default_model="sets",
        store={"url": database_url},
        monitoring=fast | (monitoring or {}),
        **groups,
    )


def predict(base_url: str, n: int, seed: int) -> list[dict]:
    x = np.random.default_rng(seed).normal(0, 1.5, (n, 1, 2, 2)).round(4).tolist()
    body = loopback.post(f"{base_url}/predict", json={"inputs": x}, timeout=30).json()
    return body["predictions"]


def outside(prediction: dict) -> int:
    """The most probable class its prediction set left out (the least probable class when the set holds all)."""
    left_out = [
        k for k in np.argsort(prediction["probabilities"])[::-1] if CLASSES[k] not in prediction["prediction_set"]
    ]
    return int(left_out[0]) if left_out else int(np.argmin(prediction["probabilities"]))


def feedback(base_url: str, items: list[dict]) -> None:
    for start in range(0, len(items), 200):
        response = loopback.post(f"{base_url}/feedback", json={"items": items[start : start + 200]}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] + len(response.json().get("pending", [])) == len(items[start : start + 200])


def coverage_of(base_url: str) -> dict:
    return loopback.get(f"{base_url}/calibration", params={"window": "5000"}, timeout=30).json()["coverage"]


def folded(block: dict) -> int:
    return sum(choice["labels_folded"] for choice in block["choices"])


def served_under(url: str, version: str) -> dict | None:
    """A /predict answer of ``url``, if its sets come from the threshold of ``version``."""
    body = loopback.post(f"{url}/predict", json={"inputs": np.zeros((1, 1, 2, 2)).tolist()}).json()
    return body if body["conformal"]["threshold_version"] == version else None


def settled(urls: list[str], labels: int, timeout: float = 60.0) -> list[dict]:
    """The coverage blocks of every replica once each has folded ``labels`` labels."""
    deadline = time.monotonic() + timeout
    while True:
        blocks = [coverage_of(url) for url in urls]
        if all(folded(b) == labels for b in blocks):
            return blocks
        assert time.monotonic() < deadline, f"labels folded: {[folded(b) for b in blocks]}, expected {labels}"
        time.sleep(0.2)


def test_two_replicas_derive_the_same_coverage_alarm_and_adapted_threshold_under_a_shift(
    artifacts, database_url, server_for
):
    rng = np.random.default_rng(11)
    with ExitStack() as stack:
        a, _ = stack.enter_context(server_for(settings_for(artifacts, database_url)))
        b, _ = stack.enter_context(server_for(settings_for(artifacts, database_url)))
        # both phases are served before any label, so every set is the static threshold's: what the shift's labels
        # do to the alarm does not hang on where the calm phase's labels moved the adaptive threshold
        before = predict(a, 300, seed=1)
        after = predict(a, 400, seed=2)
        assert {p["set_size"] for p in before} - {0} and predict(b, 1, seed=9)[0]["prediction_set"] is not None
        time.sleep(1.0)  # replica a writes its prediction log every 0.5 s
        # exchangeable: labels drawn from the served probabilities
        draws = [rng.choice(5, p=np.array(p["probabilities"]) / sum(p["probabilities"])) for p in before]
        feedback(b, [{"prediction_id": p["id"], "label": int(k)} for p, k in zip(before, draws)])
        calm = settled([a, b], 300)
        assert calm[0] == calm[1]
        choice = next(c for c in calm[0]["choices"] if c["method"] == "aps" and c["coverage"] == 0.8)
        # labels drawn from the probabilities: no alarm (a false one has probability <= 300 / A = 0.3%), and the
        # sets cover about their target (their calibration split is not this toy model's, and randomized sets
        # draw from the random prediction ids, so only roughly)
        assert choice["alarm"]["state"] == "ok" and choice["n"] == 300
        assert 0.65 < choice["observed"] < 0.95

        # the shift: each label falls outside its served set where the set leaves a class out
        shift = [{"prediction_id": p["id"], "label": outside(p)} for p in after]
        assert sum(CLASSES[item["label"]] not in p["prediction_set"] for item, p in zip(shift, after)) > 300
        feedback(a, shift)
        shifted = settled([a, b], 700)
        assert shifted[0] == shifted[1]  # bit for bit: the same JSON from both replicas
        choice = next(c for c in shifted[0]["choices"] if c["method"] == "aps" and c["coverage"] == 0.8)
        assert choice["alarm"]["state"] == "alarm" and choice["alarm"]["since"] is not None
        assert choice["below_target"] and choice["observed"] < 0.6 and choice["n"] == 700
        assert choice["threshold"] is None or choice["threshold"] > choice["static_threshold"]
        assert choice["threshold_version"].endswith(":700") and shifted[0]["adaptation"] == "log-quantile"
        by_class = {row["label"]: row for row in choice["by_class"]}
        assert sum(row["n"] for row in by_class.values()) == 700
        assert sum(row["n"] for row in choice["by_set_size"]) == 700

        # both replicas now serve the adapted threshold, under the same version, and say so in /metrics; the replica
        # that did not fold the labels serves them once its monitoring loop loads the stored state (a bounded wait)
        version = choice["threshold_version"]
        for url in (a, b):
            body = wait_for(lambda url=url: served_under(url, version), 30, f"{url} serving {version}", every=0.2)
            assert body["conformal"]["threshold"] == choice["threshold"]
            families = {f.name: f for f in text_string_to_metric_families(loopback.get(f"{url}/metrics").text)}
            alarms = {
                (s.labels["method"], s.labels["coverage"]): s.value
                for s in families["calib_set_coverage_alarm"].samples
            }
            assert alarms[("aps", "0.8")] == 1


def test_with_adaptation_off_the_sets_keep_the_static_threshold(artifacts, tmp_path, server_for):
    settings = settings_for(artifacts, f"sqlite:///{tmp_path / 'm.db'}", conformal={"adaptation": "off"})
    with server_for(settings) as (url, _):
        served = predict(url, 120, seed=3)
        time.sleep(1.0)
        feedback(url, [{"prediction_id": p["id"], "label": int(np.argmin(p["probabilities"]))} for p in served])

        def aps(block: dict) -> dict:
            return next(c for c in block["choices"] if c["method"] == "aps")

        block = wait_for(lambda: b if aps(b := coverage_of(url))["labels_folded"] == 120 else None, 60, "120 folds")
        choice = aps(block)
        assert block["adaptation"] == "off" and choice["threshold"] == choice["static_threshold"]
        assert choice["threshold_version"].endswith(":0") and choice["alarm"]["state"] == "alarm"
        body = loopback.post(f"{url}/predict", json={"inputs": np.zeros((1, 1, 2, 2)).tolist()}).json()
        assert body["conformal"]["threshold_version"].endswith(":0")


def test_a_window_past_every_label_reports_them_all(artifacts, tmp_path, server_for):
    with server_for(settings_for(artifacts, f"sqlite:///{tmp_path / 'm.db'}")) as (url, _):
        served = predict(url, 20, seed=4)
        time.sleep(1.0)
        feedback(url, [{"prediction_id": p["id"], "label": 0} for p in served])
        settled([url], 20)
        for window in ("99999999999999999999999", "1000000d"):
            response = loopback.get(f"{url}/calibration", params={"window": window})
            assert response.status_code == 200, response.text
            assert sum(c["n"] for c in response.json()["coverage"]["choices"]) == 20


def test_labels_a_thousand_predictions_late_keep_every_window_covering_with_no_empty_set(tmp_path, server_for):
    """The default artifact and settings, in-distribution traffic (digits' test rows, which neither the model nor
    its conformal scores saw, resampled), 50 rows a request; each label sent 1,000 predictions after its
    prediction, 200 at a time: every window of 1,000 sets the client received covers at least the target less 3
    points, none is empty, and the adaptive threshold and the alarm fold the labels without firing. At 0.95, where
    the conformal split's 4 errors in 180 rows leave the static floor sets at the top label, the tracker adapts."""
    from training.data import load_dataset

    test = load_dataset("digits").test
    rng = np.random.default_rng(21)
    root = Path(__file__).resolve().parents[3] / "artifacts"
    settings = Settings(
        artifacts=root, store={"url": f"sqlite:///{tmp_path / 'm.db'}"}, monitoring={"evaluate_seconds": 0.2}
    )
    delay, batch, total, coverage = 1_000, 200, 6_000, 0.95
    received: list[tuple[list[str], str]] = []  # (the set, the true label) per prediction, in order
    sent = 0
    with server_for(settings) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        while len(received) < total:
            rows = rng.integers(0, len(test.y), 50)
            body = client.post("/predict", json={"inputs": test.x[rows].tolist(), "coverage": coverage}).json()
            received += [(p["prediction_set"], p["id"], str(test.y[r])) for p, r in zip(body["predictions"], rows)]
            while len(received) - delay - sent >= batch:  # the labels of predictions 1,000 old, 200 at a time
                items = [{"prediction_id": i, "label": y} for _, i, y in received[sent : sent + batch]]
                response = client.post("/feedback", json={"items": items})
                assert response.status_code == 200 and not response.json()["rejected"], response.text
                sent += batch
        block = client.get("/calibration", params={"window": "100000"}).json()["coverage"]
    assert all(len(members) >= 1 for members, _, _ in received)
    hits = np.array([label in members for members, _, label in received])
    windows = hits.reshape(-1, 1_000).mean(axis=1)
    assert windows.min() >= coverage - 0.03, windows
    choice = next(c for c in block["choices"] if c["coverage"] == coverage and not c["randomized"])
    assert choice["labels_folded"] > 0 and choice["alarm"]["state"] == "ok"


def test_a_thousand_undeclared_levels_are_refused_and_grow_neither_state_nor_series(artifacts, tmp_path, server_for):
    """Only the declared levels (CALIB_CONFORMAL__LEVELS and the artifact's default) are served, so only they keep
    adaptive state and metric series: 1,000 distinct other levels are each refused, naming the field and the levels,
    and the stored state and /metrics are as before."""

    def series(url: str) -> set:
        families = text_string_to_metric_families(loopback.get(f"{url}/metrics").text)
        return {
            (s.name, tuple(sorted(s.labels.items())))
            for f in families
            if f.name.startswith("calib_set")
            for s in f.samples
        }

    with server_for(settings_for(artifacts, f"sqlite:///{tmp_path / 'm.db'}")) as (url, app):
        served = predict(url, 60, seed=5)
        time.sleep(1.0)
        feedback(url, [{"prediction_id": p["id"], "label": 0} for p in served])
        settled([url], 60)
        before, state = series(url), app.state.parts.store.coverage.get("sets", "1").states
        levels = np.linspace(0.001, 0.999, 1_000)
        with httpx.Client(base_url=url, timeout=30) as client:
            for level in levels:
                response = client.post("/predict", json={"inputs": np.zeros((1, 1, 2, 2)).tolist(), "coverage": level})
                assert response.status_code == 422 and response.json()["error"]["field"] == "coverage"
        assert "levels served are [0.8, 0.9, 0.95]" in response.json()["error"]["message"]
        time.sleep(0.5)
        assert series(url) == before and app.state.parts.store.coverage.get("sets", "1").states == state
        assert {c["coverage"] for c in coverage_of(url)["choices"]} == {0.8}


def test_labels_fold_into_the_sets_states_as_they_arrive_not_at_the_next_evaluation(artifacts, tmp_path, server_for):
    """With the evaluation pass a minute away, stored labels still reach the adaptive threshold within a fraction of
    a second (``SetsFolder``): the served threshold lags the labels by their delay only."""
    settings = settings_for(
        artifacts,
        f"sqlite:///{tmp_path / 'm.db'}",
        monitoring={"evaluate_seconds": 60.0, "evaluate_every_labels": 1_000_000},
    )
    with server_for(settings) as (url, _):
        served = predict(url, 80, seed=6)
        time.sleep(1.0)
        sent = time.monotonic()
        feedback(url, [{"prediction_id": p["id"], "label": 0} for p in served])
        settled([url], 80, timeout=10.0)
        assert time.monotonic() - sent < 10.0
