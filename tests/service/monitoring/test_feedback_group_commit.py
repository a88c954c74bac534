"""POST /feedback group commit: the requests that arrive while a write is in progress are stored
together in one transaction, and each is answered with its own result, on SQLite and PostgreSQL."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from bench.common import loopback
from service.settings import Settings
from service.store.schema import labels
from training.data import load_digits_splits

DIGITS = load_digits_splits().test
ALREADY = "duplicate feedback: this prediction already has a label"


class HeldWriter:
    """Holds the feedback writer's first group in its worker thread until released, so that the
    requests sent meanwhile queue up and form the next group; records the requests of every group
    and the label transactions."""

    def __init__(self, app):
        self.app = app
        self.recorder, self.labels = app.state.parts.monitor.labels, app.state.parts.store.labels
        self.group, self.insert = self.recorder.record_group, self.labels.insert
        self.entered, self.released = threading.Event(), threading.Event()
        self.groups: list[int] = []
        self.transactions = 0
        self.recorder.record_group = self._group
        self.labels.insert = self._insert

    def _group(self, requests):
        self.groups.append(len(requests))
        if len(self.groups) == 1:
            self.entered.set()
            self.released.wait(30)
        return self.group(requests)

    def _insert(self, *args, **kwargs):
        self.transactions += 1
        return self.insert(*args, **kwargs)

    def wait_queued(self, n: int) -> None:
        """Wait until ``n`` requests wait for the next group."""
        deadline = time.monotonic() + 10
        while self.app.state.parts.feedback.pending < n:
            assert time.monotonic() < deadline, f"{self.app.state.parts.feedback.pending} requests queued, not {n}"
            time.sleep(0.005)

    def restore(self) -> None:
        self.released.set()
        del self.recorder.record_group, self.labels.insert


@pytest.fixture
def held(repository_dir, server_for, database_url):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": database_url},
        monitoring={"bootstrap_resamples": 300},
    )
    with server_for(settings) as (base_url, app):
        writer = HeldWriter(app)
        try:
            yield base_url, app, writer
        finally:
            writer.restore()


def _ids(base_url, n):
    body = loopback.post(f"{base_url}/predict", json={"inputs": DIGITS.x[:n].tolist()}).json()
    return [p["id"] for p in body["predictions"]]


def _post(base_url, payload=None, content=None):
    if content is not None:
        return loopback.post(
            f"{base_url}/feedback", content=content, headers={"content-type": "application/json"}, timeout=30
        )
    return loopback.post(f"{base_url}/feedback", json=payload, timeout=30)


def _stored_labels(app, ids) -> dict:
    with app.state.parts.store.db.engine.connect() as c:
        return dict(
            c.execute(sa.select(labels.c.prediction_id, labels.c.label).where(labels.c.prediction_id.in_(ids))).all()
        )


def test_concurrent_requests_are_committed_together_and_answered_each_with_its_own_indexes(held):
    base_url, app, writer = held
    ids = _ids(base_url, 6)
    requests = [
        {"items": [{"prediction_id": ids[1], "label": 3}, {"prediction_id": "f" * 32, "label": 1}]},
        {"items": [{"probabilities": [0.1] * 10, "label": 2}, {"prediction_id": ids[2], "label": "eleven"}]},
        {"items": [{"prediction_id": ids[3], "label": 4}, {"prediction_id": ids[3], "label": 5}]},
        {"items": [{"prediction_id": ids[0], "label": 2}]},
        {"items": [{"probabilities": [0.2] * 10, "label": 1}, {"prediction_id": ids[4], "label": "7"}]},
    ]
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[0], "label": 1}]})
        assert writer.entered.wait(10)
        answers = []
        for k, payload in enumerate(requests):
            answers.append(pool.submit(_post, base_url, payload))
            writer.wait_queued(k + 1)
        # requests refused before they could join the group do not disturb it
        too_many = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[5], "label": 1}] * 10001})
        not_json = pool.submit(_post, base_url, content=b"{nope")
        assert too_many.result().status_code == 422 and not_json.result().status_code == 400
        writer.released.set()
        assert first.result().json() == {"accepted": 1, "pending": [], "rejected": []}
        bodies = [a.result() for a in answers]
    assert all(b.status_code == 200 for b in bodies), [b.text for b in bodies]
    bodies = [b.json() for b in bodies]
    assert writer.groups == [1, 5] and writer.transactions == 2
    assert [b["accepted"] for b in bodies] == [1, 1, 1, 0, 1]
    rejected = [[(r["index"], r["prediction_id"]) for r in b["rejected"]] for b in bodies]
    assert rejected == [[(1, "f" * 32)], [(1, ids[2])], [(1, ids[3])], [(0, ids[0])], [(0, None)]]
    reasons = [[r["reason"] for r in b["rejected"]] for b in bodies]
    assert "unknown prediction id" in reasons[0][0]
    assert "'eleven' is not a class" in reasons[1][0]
    assert reasons[2] == ["duplicate feedback for this prediction id in this request"]
    assert reasons[3] == [ALREADY]
    assert "must sum to 1" in reasons[4][0]
    assert _stored_labels(app, ids) == {ids[0]: 1, ids[1]: 3, ids[3]: 4, ids[4]: 7}
    assert loopback.get(f"{base_url}/calibration", params={"window": "1000"}).json()["n"] == 5


def test_the_first_request_of_a_group_wins_a_prediction_labelled_twice(held):
    base_url, app, writer = held
    ids = _ids(base_url, 3)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[2], "label": 0}]})
        assert writer.entered.wait(10)
        a = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[0], "label": 1}]})
        writer.wait_queued(1)
        b = pool.submit(
            _post, base_url, {"items": [{"prediction_id": ids[0], "label": 2}, {"prediction_id": ids[1], "label": 3}]}
        )
        writer.wait_queued(2)
        c = pool.submit(
            _post, base_url, {"items": [{"prediction_id": ids[1], "label": 4}, {"prediction_id": ids[2], "label": 5}]}
        )
        writer.wait_queued(3)
        writer.released.set()
        assert first.result().json()["accepted"] == 1
        a, b, c = a.result().json(), b.result().json(), c.result().json()
    assert writer.groups == [1, 3]
    assert a == {"accepted": 1, "pending": [], "rejected": []}
    assert b == {"accepted": 1, "pending": [], "rejected": [{"index": 0, "prediction_id": ids[0], "reason": ALREADY}]}
    assert c == {
        "accepted": 0,
        "pending": [],
        "rejected": [
            {"index": 0, "prediction_id": ids[1], "reason": ALREADY},
            {"index": 1, "prediction_id": ids[2], "reason": ALREADY},
        ],
    }
    assert _stored_labels(app, ids) == {ids[0]: 1, ids[1]: 3, ids[2]: 0}


def test_shutdown_writes_the_queued_requests_first(held):
    base_url, app, writer = held
    ids = _ids(base_url, 4)
    feedback_writer = app.state.parts.feedback
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[0], "label": 1}]})
        assert writer.entered.wait(10)
        queued = []
        for k in (1, 2, 3):
            queued.append(pool.submit(_post, base_url, {"items": [{"prediction_id": ids[k], "label": k}]}))
            writer.wait_queued(k)
        stopping = asyncio.run_coroutine_threadsafe(feedback_writer.stop(), feedback_writer.loop)
        time.sleep(0.2)
        assert not stopping.done()
        writer.released.set()
        stopping.result(30)
        assert [f.result().json()["accepted"] for f in [first, *queued]] == [1, 1, 1, 1]
    assert _stored_labels(app, ids) == {ids[0]: 1, ids[1]: 1, ids[2]: 2, ids[3]: 3}
    late = _post(base_url, {"items": [{"prediction_id": ids[0], "label": 1}]})
    assert late.status_code == 503 and late.json()["error"]["code"] == "not_ready"


@pytest.mark.e2e  # needs PostgreSQL
def test_a_storage_outage_fails_the_whole_group_and_nothing_of_it_is_stored(
    repository_dir, server_for, pg_url, cuttable_proxy
):
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        monitoring={"bootstrap_resamples": 300, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        store={"url": cuttable_proxy.database_url},
    )  # no evaluation touches the store
    with server_for(settings) as (base_url, app):
        ids = _ids(base_url, 4)
        writer = HeldWriter(app)
        try:
            with ThreadPoolExecutor(4) as pool:
                first = pool.submit(_post, base_url, {"items": [{"prediction_id": ids[0], "label": 1}]})
                assert writer.entered.wait(10)  # the log was flushed: every prediction is stored
                group = []
                for k in (1, 2, 3):
                    payload = {
                        "items": [{"prediction_id": ids[k], "label": k}, {"probabilities": [0.1] * 10, "label": k}]
                    }
                    group.append(pool.submit(_post, base_url, payload))
                    writer.wait_queued(k)
                cuttable_proxy.cut()
                writer.released.set()
                answers = [f.result() for f in [first, *group]]
        finally:
            writer.restore()
        assert writer.groups == [1, 3]
        for r in answers:
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert r.json()["error"]["code"] == "storage_unavailable"
        cuttable_proxy.restore()
        engine = sa.create_engine(pg_url)
        try:
            with engine.connect() as c:
                assert c.execute(sa.select(sa.func.count()).select_from(labels)).scalar_one() == 0
        finally:
            engine.dispose()
        again = _post(base_url, {"items": [{"prediction_id": i, "label": 1} for i in ids]})
        assert again.json() == {"accepted": 4, "pending": [], "rejected": []}
