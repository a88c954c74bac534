"""Coverage of the served prediction sets, end to end over HTTP: predictions with sets on one replica, feedback
under a scripted shift on the other, and the coverage block, the coverage alarm and the adapted threshold that
both replicas derive from the shared store, identical to the bit, on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.settings import Settings

CLASSES = ("a", "b", "c", "d", "e")


@pytest.fixture
def artifacts(tmp_path, linear_artifact, add_conformal):
    root = tmp_path / "artifacts"
    add_conformal(linear_artifact(root, "sets", "1", classes=CLASSES, seed=3))
    return root


def settings_for(artifacts, database_url: str, **extra) -> Settings:
    return Settings(
        artifacts=artifacts,
        default_model="sets",
        database_url=database_url,
        evaluate_seconds=0.2,
        evaluate_every_labels=50,
        bootstrap_resamples=200,
        **extra,
    )


def predict(base_url: str, n: int, seed: int) -> list[dict]:
    x = np.random.default_rng(seed).normal(0, 1.5, (n, 1, 2, 2)).round(4).tolist()
    body = httpx.post(f"{base_url}/predict", json={"inputs": x}, timeout=30).json()
    return body["predictions"]


def outside(prediction: dict) -> int:
    """The most probable class its prediction set left out (the least probable class when the set holds all)."""
    left_out = [
        k for k in np.argsort(prediction["probabilities"])[::-1] if CLASSES[k] not in prediction["prediction_set"]
    ]
    return int(left_out[0]) if left_out else int(np.argmin(prediction["probabilities"]))


def feedback(base_url: str, items: list[dict]) -> None:
    for start in range(0, len(items), 200):
        response = httpx.post(f"{base_url}/feedback", json={"items": items[start : start + 200]}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] + len(response.json().get("pending", [])) == len(items[start : start + 200])


def coverage_of(base_url: str) -> dict:
    return httpx.get(f"{base_url}/calibration", params={"window": "5000"}, timeout=30).json()["coverage"]


def folded(block: dict) -> int:
    return sum(choice["labels_folded"] for choice in block["choices"])


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

        # both replicas now serve the adapted threshold, under the same version, and say so in /metrics
        for url in (a, b):
            body = httpx.post(f"{url}/predict", json={"inputs": np.zeros((1, 1, 2, 2)).tolist()}).json()
            assert body["conformal"]["threshold_version"] == choice["threshold_version"]
            assert body["conformal"]["threshold"] == choice["threshold"]
            families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
            alarms = {
                (s.labels["method"], s.labels["coverage"]): s.value
                for s in families["calib_set_coverage_alarm"].samples
            }
            assert alarms[("aps", "0.8")] == 1


def test_with_adaptation_off_the_sets_keep_the_static_threshold(artifacts, tmp_path, server_for):
    settings = settings_for(artifacts, f"sqlite:///{tmp_path / 'm.db'}", conformal_adaptation="off")
    with server_for(settings) as (url, _):
        served = predict(url, 120, seed=3)
        time.sleep(1.0)
        feedback(url, [{"prediction_id": p["id"], "label": int(np.argmin(p["probabilities"]))} for p in served])
        deadline = time.monotonic() + 60
        while True:
            block = coverage_of(url)
            choice = next(c for c in block["choices"] if c["method"] == "aps")
            if choice["labels_folded"] == 120:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert block["adaptation"] == "off" and choice["threshold"] == choice["static_threshold"]
        assert choice["threshold_version"].endswith(":0") and choice["alarm"]["state"] == "alarm"
        body = httpx.post(f"{url}/predict", json={"inputs": np.zeros((1, 1, 2, 2)).tolist()}).json()
        assert body["conformal"]["threshold_version"].endswith(":0")


def test_a_window_past_every_label_reports_them_all(artifacts, tmp_path, server_for):
    with server_for(settings_for(artifacts, f"sqlite:///{tmp_path / 'm.db'}")) as (url, _):
        served = predict(url, 20, seed=4)
        time.sleep(1.0)
        feedback(url, [{"prediction_id": p["id"], "label": 0} for p in served])
        settled([url], 20)
        for window in ("99999999999999999999999", "1000000d"):
            response = httpx.get(f"{url}/calibration", params={"window": window})
            assert response.status_code == 200, response.text
            assert sum(c["n"] for c in response.json()["coverage"]["choices"]) == 20
