"""Monitoring across processes: shared PostgreSQL, restarts, SIGKILL, and a database outage."""

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from bench.common import loopback
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.ports import free_port
from training.data import load_digits_splits

DIGITS = load_digits_splits().test
pytestmark = pytest.mark.e2e  # server processes (python -m service), some on PostgreSQL


class Replica:
    """``python -m service`` in a subprocess, as docker-compose runs it (same flags and variables)."""

    def __init__(self, artifacts, database_url, **env):
        self.args = (artifacts, database_url)
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = dict(
            os.environ,
            CALIB_STORE__URL=database_url,
            CALIB_DEFAULT_MODEL="digits-lenet5",
            CALIB_MONITORING__BOOTSTRAP_RESAMPLES="300",
            CALIB_MONITORING__EVALUATE_SECONDS="0.2",
            # the label-shift alarm folds predictions as soon as they are logged: with its default settle time, a
            # pass folding them could fall between the two replicas' reports the tests compare
            CALIB_SHIFT__SETTLE_SECONDS="0",
        )
        environment.update(env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", "--artifacts", str(artifacts), "--port", str(self.port)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                if loopback.get(f"{self.url}/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(self.process.communicate()[0])

    def stop(self, sig=signal.SIGTERM):
        self.process.send_signal(sig)
        return self.process.communicate(timeout=30)[0]

    def restarted(self) -> "Replica":
        """A new process with the same settings (on a new port)."""
        return Replica(*self.args, **self.env)


def _evaluation_passes(url) -> float:
    text = loopback.get(f"{url}/metrics").text
    return next(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("calib_evaluation_duration_seconds_count")
    )


def _evaluated(*replicas, timeout=60.0) -> None:
    """Wait until every replica has completed two more alarm evaluation passes: the second began after
    everything acknowledged so far was committed (the first may have begun before)."""
    targets = [(r, _evaluation_passes(r.url) + 2) for r in replicas]
    deadline = time.monotonic() + timeout
    for replica, target in targets:
        while _evaluation_passes(replica.url) < target:
            assert time.monotonic() < deadline, "no alarm evaluation"
            time.sleep(0.05)


def _offline_items(n, seed, scale=1.0):
    z, y = calibrated_logits(n, n_classes=10, logit_scale=8.0, seed=seed)
    return [{"probabilities": p.tolist(), "label": int(t)} for p, t in zip(softmax(scale * z), y)]


def test_two_replicas_sharing_postgresql_report_the_same_calibration(repository_dir, pg_url):
    a, b = Replica(repository_dir, pg_url), Replica(repository_dir, pg_url)
    try:
        body = loopback.post(f"{a.url}/predict", json={"inputs": DIGITS.x[:60].tolist()}).json()
        time.sleep(1.5)  # replica a writes its prediction log every 0.5 s
        items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(body["predictions"], DIGITS.y[:60])]
        assert loopback.post(f"{b.url}/feedback", json={"items": items}).json()["accepted"] == 60
        assert loopback.post(f"{a.url}/feedback", json={"items": _offline_items(300, 1)}).json()["accepted"] == 300
        assert loopback.post(f"{b.url}/feedback", json={"items": _offline_items(300, 2, 2.5)}).json()["accepted"] == 300
        _evaluated(a, b)
        for window in ("500", "1000", "1h"):
            report_a = loopback.get(f"{a.url}/calibration", params={"window": window}).json()
            report_b = loopback.get(f"{b.url}/calibration", params={"window": window}).json()
            assert report_a == report_b
        assert report_a["n"] == 660
    finally:
        a.stop()
        b.stop()


def test_restart_keeps_everything_and_sigkill_loses_no_acknowledged_feedback(repository_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    first = Replica(repository_dir, url)
    body = loopback.post(f"{first.url}/predict", json={"inputs": DIGITS.x[:40].tolist()}).json()
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(body["predictions"], DIGITS.y[:40])]
    assert loopback.post(f"{first.url}/feedback", json={"items": items}).json()["accepted"] == 40
    _evaluated(first)
    before = loopback.get(f"{first.url}/calibration", params={"window": "1000"}).json()
    first.stop()
    second = Replica(repository_dir, url)
    after = loopback.get(f"{second.url}/calibration", params={"window": "1000"}).json()
    assert after == before and after["n"] == 40

    # single-label requests from 32 clients at once (they are group-committed) next to batches of 25
    # offline items, until the process is killed mid-load
    rows = np.resize(DIGITS.x, (4000, *DIGITS.x.shape[1:]))
    ids = [
        p["id"]
        for start in range(0, 4000, 1000)
        for p in loopback.post(
            f"{second.url}/predict", json={"inputs": rows[start : start + 1000].tolist()}, timeout=60
        ).json()["predictions"]
    ]
    unlabelled = iter(ids)
    acknowledged, sent, acknowledged_ids, sent_ids = [], [], [], []
    lock = threading.Lock()

    def send(seed):
        batch = _offline_items(25, 100 + seed)
        sent.append(len(batch))
        try:
            r = loopback.post(f"{second.url}/feedback", json={"items": batch}, timeout=10)
            if r.status_code == 200:
                acknowledged.append(r.json()["accepted"])
        except httpx.TransportError:
            pass

    def label_one_at_a_time():
        with httpx.Client(base_url=second.url, timeout=10) as client:
            while True:
                with lock:
                    prediction_id = next(unlabelled, None)
                if prediction_id is None:
                    return
                sent_ids.append(prediction_id)
                try:
                    r = client.post("/feedback", json={"items": [{"prediction_id": prediction_id, "label": 1}]})
                except httpx.TransportError:
                    return
                if r.status_code == 200 and r.json()["accepted"] == 1:
                    acknowledged_ids.append(prediction_id)

    with ThreadPoolExecutor(36) as pool:
        singles = [pool.submit(label_one_at_a_time) for _ in range(32)]
        futures = [pool.submit(send, s) for s in range(400)]
        deadline = time.monotonic() + 60
        while not acknowledged or len(acknowledged_ids) < 200:
            assert time.monotonic() < deadline, (len(acknowledged), len(acknowledged_ids))
            time.sleep(0.01)
        second.stop(signal.SIGKILL)
        for f in itertools.chain(singles, futures):
            f.result()
    assert second.process.returncode == -signal.SIGKILL and 0 < len(acknowledged) < 400
    assert 200 <= len(acknowledged_ids) < len(ids)
    third = Replica(repository_dir, url)
    try:
        stored = loopback.get(f"{third.url}/calibration", params={"window": "100000"}).json()["n"]
    finally:
        third.stop()
    assert 40 + sum(acknowledged) + len(acknowledged_ids) <= stored <= 40 + sum(sent) + len(sent_ids)
    with sqlite3.connect(tmp_path / "store.db") as db:
        labelled = {prediction_id.hex() for (prediction_id,) in db.execute("SELECT prediction_id FROM labels")}
    assert set(acknowledged_ids) <= labelled


def test_database_outage_degrades_and_recovers(repository_dir, pg_url, cuttable_proxy):
    proxy = cuttable_proxy
    replica = Replica(repository_dir, proxy.database_url)
    try:
        assert loopback.post(f"{replica.url}/feedback", json={"items": _offline_items(5, 1)}).json()["accepted"] == 5
        proxy.cut()
        during = loopback.post(f"{replica.url}/predict", json={"inputs": DIGITS.x[:3].tolist()})
        assert during.status_code == 200
        refused = loopback.post(f"{replica.url}/feedback", json={"items": _offline_items(5, 2)})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "storage_unavailable"
        health = loopback.get(f"{replica.url}/health").json()
        assert health["status"] == "degraded" and health["storage"]["up"] is False and health["ready"]
        assert health["storage"]["prediction_log_pending"] == 3
        assert "calib_storage_up 0.0" in loopback.get(f"{replica.url}/metrics").text
        assert loopback.get(f"{replica.url}/calibration").status_code == 503
        proxy.restore()
        deadline = time.monotonic() + 20
        while loopback.get(f"{replica.url}/health").json()["storage"]["up"] is False:
            assert time.monotonic() < deadline, "the service did not recover"
            time.sleep(0.2)
        # predictions made during the outage were kept and written: their feedback is accepted now
        items = [
            {"prediction_id": p["id"], "label": int(t)} for p, t in zip(during.json()["predictions"], DIGITS.y[:3])
        ]
        recovered = loopback.post(f"{replica.url}/feedback", json={"items": items}).json()
        assert recovered["accepted"] == 3, recovered
        assert loopback.get(f"{replica.url}/calibration").json()["n"] == 8
        assert loopback.get(f"{replica.url}/health").json()["status"] == "ok"
    finally:
        replica.stop()


class LabellingClients:
    """Clients that predict on one replica and send the labels at once to the next one (within
    milliseconds, as behind a load balancer), resending a label that got no answer as a careful client does.
    ``urls`` may change under them (a replica restarted on a new port)."""

    def __init__(self, urls: list[str], clients: int = 8):
        self.urls, self.clients = urls, clients
        self.answered: list[str] = []  # every id /predict returned
        self.outcomes: dict[str, str] = {}  # prediction id -> accepted, pending or the rejection's reason
        self.resent: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(clients)
        self._futures = [self._pool.submit(self._client, k) for k in range(clients)]

    def stop(self) -> None:
        self._stop.set()
        for f in self._futures:
            f.result()
        self._pool.shutdown()

    def _client(self, k: int) -> None:
        rng = np.random.default_rng(k)
        with httpx.Client(timeout=10) as http:
            for turn in itertools.count(k):
                if self._stop.is_set():
                    return
                rows = rng.integers(0, len(DIGITS.y), size=rng.integers(1, 5))
                try:
                    url = self.urls[turn % len(self.urls)]
                    r = http.post(f"{url}/predict", json={"inputs": DIGITS.x[rows].tolist()})
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if r.status_code != 200:
                    continue
                ids = [p["id"] for p in r.json()["predictions"]]
                self.answered += ids
                items = [{"prediction_id": i, "label": int(DIGITS.y[j])} for i, j in zip(ids, rows)]
                self._label(http, turn + 1, items)

    def _label(self, http: httpx.Client, turn: int, items: list[dict]) -> None:
        deadline, attempt = time.monotonic() + 40, 0
        while True:
            try:
                r = http.post(f"{self.urls[turn % len(self.urls)]}/feedback", json={"items": items})
                if r.status_code == 200:
                    break
                assert r.status_code == 503, r.text
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "feedback never answered"
            attempt += 1
            time.sleep(0.1)
        body = r.json()
        for item in body["pending"]:
            self.outcomes[item["prediction_id"]] = "pending"
        for item in body["rejected"]:
            self.outcomes[item["prediction_id"]] = item["reason"]
            if attempt:
                self.resent.add(item["prediction_id"])
        for item in items:
            self.outcomes.setdefault(item["prediction_id"], "accepted")


def _stored_ids(url: str) -> tuple[set[str], set[str]]:
    """(ids of the stored predictions, ids of the stored labels), read from the store itself."""
    import sqlalchemy as sa

    from service.store.schema import labels, prediction_log

    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return (
                {r[0] for r in c.execute(sa.select(prediction_log.c.id))},
                {r[0] for r in c.execute(sa.select(labels.c.prediction_id))},
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "store, replicas, durability", [("sqlite", 1, "async"), ("postgresql", 2, "async"), ("postgresql", 2, "sync")]
)
def test_no_label_is_refused_for_timing_nor_lost_under_kill_and_sigterm(
    request, repository_dir, tmp_path, store, replicas, durability
):
    """Labels sent within milliseconds of their prediction, to another replica, while one replica is killed with
    SIGKILL and restarted and another stopped with SIGTERM and restarted: every label acknowledged (accepted or
    pending) ends joined or listed as expired, none is refused, the replicas agree, and under sync durability
    every id answered is stored."""
    url = f"sqlite:///{tmp_path / 'store.db'}" if store == "sqlite" else request.getfixturevalue("pg_url")
    env = {"CALIB_LABELS__PENDING_SECONDS": "3", "CALIB_PREDICTION_LOG__DURABILITY": durability}
    started = [Replica(repository_dir, url, **env) for _ in range(replicas)]
    clients = LabellingClients([r.url for r in started])
    try:
        time.sleep(3)
        killed = started[0]
        killed.stop(signal.SIGKILL)
        assert killed.process.returncode == -signal.SIGKILL
        started[0] = killed.restarted()
        clients.urls[0] = started[0].url
        time.sleep(3)
        drained = started[-1]
        drained.stop()
        assert drained.process.returncode == 0, "a drained replica exits 0"
        started[-1] = drained.restarted()
        clients.urls[-1] = started[-1].url
        time.sleep(2)
    finally:
        clients.stop()
    try:
        deadline = time.monotonic() + 30
        while (unmatched := loopback.get(f"{started[0].url}/feedback/unmatched", params={"limit": 10000}).json())[
            "pending"
        ]:
            assert time.monotonic() < deadline, unmatched
            time.sleep(0.2)
        predicted, labelled = _stored_ids(url)
        expired = {i["prediction_id"] for i in unmatched["items"] if i["status"] == "expired"}
        outcomes = clients.outcomes
        acknowledged = {i for i, o in outcomes.items() if o in ("accepted", "pending")}
        refused = {i: o for i, o in outcomes.items() if i not in acknowledged and i not in clients.resent}
        assert not refused, refused  # none refused: not for timing, not for anything else
        assert unmatched["rejected"] == 0, unmatched
        assert acknowledged - labelled - expired == set(), "acknowledged labels lost"
        assert not expired & predicted, "a label expired although its prediction was stored"
        assert len(labelled) >= 200, len(labelled)
        if durability == "sync":
            assert set(clients.answered) <= predicted, "an answered id was lost under sync durability"
            assert not expired and "pending" not in outcomes.values()
        elif replicas > 1:
            assert "pending" in outcomes.values(), "no label reached another replica before its prediction"
        _evaluated(*started)
        reports = [loopback.get(f"{r.url}/calibration", params={"window": "100000"}).json() for r in started]
        assert all(report == reports[0] for report in reports)
        assert reports[0]["n"] == len(labelled) and reports[0]["unmatched_labels"]["expired"] == len(expired)
    finally:
        for r in started:
            r.stop()


def _protected(report: dict) -> dict:
    """What labels from outside the trusted sources must not move: the e-detector (but for the store's label
    counts), the alarm and the refit."""
    lag = ("labels_stored", "labels_pending", "newest_folded_labelled_at")
    return {
        "e_detector": {k: v for k, v in report["e_detector"].items() if k not in lag},
        "alarm": report["alarm"],
        "recalibration": report["recalibration"],
    }


def _label(replica: Replica, rows: np.ndarray, labels, predict: str, feedback: str) -> dict:
    """Predict ``rows`` on ``replica`` and label them on it at once; the feedback answer once every label sent
    is joined (pending ones included)."""
    served = loopback.post(
        f"{replica.url}/predict",
        json={"inputs": rows.tolist()},
        headers={"Authorization": f"Bearer {predict}"},
        timeout=30,
    )
    assert served.status_code == 200, served.text
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(served.json()["predictions"], labels)]
    answer = loopback.post(
        f"{replica.url}/feedback", json={"items": items}, headers={"Authorization": f"Bearer {feedback}"}, timeout=30
    )
    assert answer.status_code == 200 and not answer.json()["rejected"], answer.text
    return answer.json()


def test_labels_from_outside_the_trusted_sources_never_move_the_alarm_nor_the_refit(repository_dir, pg_url, tmp_path):
    """Two replicas on PostgreSQL with feedback tokens, the alarm and the refit trusting one source: a flood of
    wrong labels without a token is refused and changes nothing, to the bit; wrong labels from a valid but
    untrusted token are stored and reported under their source while the alarm and the refit ignore them; a
    rotated-out token is refused while its successor works."""
    tokens = tmp_path / "feedback-tokens"
    tokens.write_text("labeller:token-a\nintern:token-i\n")
    env = {
        "CALIB_AUTH__FEEDBACK_TOKENS_FILE": str(tokens),
        "CALIB_AUTH__PREDICT_TOKENS": "app:token-p",
        "CALIB_LABELS__TRUSTED_SOURCES": "labeller",
        "CALIB_MONITORING__REFRESH_SECONDS": "0.5",
        "CALIB_AUTH__REFRESH_SECONDS": "0.5",
    }
    a, b = Replica(repository_dir, pg_url, **env), Replica(repository_dir, pg_url, **env)

    def report(replica: Replica, **params) -> dict:
        return loopback.get(f"{replica.url}/calibration", params={"window": "1000", **params}).json()

    try:
        _label(a, DIGITS.x[:200], DIGITS.y[:200], "token-p", "token-a")
        _label(b, DIGITS.x[200:300], DIGITS.y[200:300], "token-p", "token-a")
        _evaluated(a, b)
        before = [report(a), report(b)]
        assert before[0] == before[1] and before[0]["n"] == 300 and before[0]["recalibration"] is not None
        assert before[0]["e_detector"]["labels_seen"] == 300

        wrong = _offline_items(100, 7, scale=4.0)
        for item in wrong:
            item["label"] = (item["label"] + 1) % 10
        for replica in (a, b):
            for headers in ({}, {"Authorization": "Bearer token-p"}, {"Authorization": "Bearer token-x"}):
                for _ in range(10):
                    refused = loopback.post(f"{replica.url}/feedback", json={"items": wrong}, headers=headers)
                    assert refused.status_code == 401, refused.text
        _evaluated(a, b)
        assert [report(a), report(b)] == before  # nothing stored, nothing moved: to the bit

        _label(a, DIGITS.x[:150], (DIGITS.y[:150] + 1) % 10, "token-p", "token-i")  # a wrong label for each
        assert (
            loopback.post(
                f"{b.url}/feedback", json={"items": wrong}, headers={"Authorization": "Bearer token-i"}
            ).json()["accepted"]
            == 100
        )
        _evaluated(a, b)
        after = [report(a, by_source="true"), report(b, by_source="true")]
        assert after[0] == after[1] and after[0]["n"] == 550  # stored, and in the window
        assert _protected(after[0]) == _protected(before[0])  # the alarm and the refit ignore them
        sources = after[0]["by_source"]
        assert sources["intern"]["n"] == 250 and sources["intern"]["trusted"] is False
        assert sources["labeller"]["n"] == 300 and sources["labeller"]["trusted"] is True
        assert sources["intern"]["accuracy"] < 0.05 < 0.9 < sources["labeller"]["accuracy"]
        unmatched = loopback.get(f"{a.url}/feedback/unmatched", headers={"Authorization": "Bearer token-i"}).json()
        assert unmatched["pending"] == 0

        tokens.write_text("labeller:token-b\nintern:token-i\n")  # the labeller's token rotated
        deadline = time.monotonic() + 20
        for replica in (a, b):
            while (
                loopback.get(
                    f"{replica.url}/feedback/unmatched", headers={"Authorization": "Bearer token-a"}
                ).status_code
                != 401
            ):
                assert time.monotonic() < deadline, "the rotated token file was not re-read"
                time.sleep(0.1)
            assert (
                loopback.get(
                    f"{replica.url}/feedback/unmatched", headers={"Authorization": "Bearer token-b"}
                ).status_code
                == 200
            )
        _label(b, DIGITS.x[300:350], DIGITS.y[300:350], "token-p", "token-b")
        _evaluated(a, b)
        rotated = [report(a), report(b)]
        assert rotated[0] == rotated[1] and rotated[0]["e_detector"]["labels_seen"] == 350  # the same source
    finally:
        a.stop()
        b.stop()
