"""The compact prediction log on SQLite and on the real PostgreSQL: a row reads back as it was served (logits left
out only where the temperature gives them back), retention drops partitions without deleting from or scanning the
log, one replica at a time does the upkeep, and a label joins its prediction until the prediction's partition
expires."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import sqlalchemy as sa

from bench.common import loopback
from calibkit.temperature import apply_temperature, fit_temperature
from service.settings import Settings
from service.store import Store, locks, partitions
from service.store.rows import OFFLINE, CalibrationKey, LabelRow, PredictionRow, encode_rows, prediction_ids
from service.store.schema import labels, prediction_log

DAY = 86400.0
NOW = 1_790_150_000.0  # 07:53 UTC: its day's partition began about 8 hours before
_TOUCHES_LOG_ROWS = re.compile(r"\b(FROM|UPDATE|INTO)\s+prediction_log(_p\d+)?\b", re.IGNORECASE)


def _served(
    n: int, k: int = 10, temperature: float | None = 1.7, seed: int = 0, at: float = NOW
) -> list[PredictionRow]:
    """``n`` rows as the service logs them: probabilities softmax(z / T) in float32, a set and priors on every third
    row, some rows with logit gaps so wide that float32 probabilities underflow to 0."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 4
    z[::10, 0] += 400.0  # float32 probabilities of the other classes underflow
    probs = apply_temperature(z, temperature or 1.0)
    ids = prediction_ids(n, at=at)
    rows = []
    for i, (pid, p, zb) in enumerate(zip(ids, encode_rows(probs), encode_rows(z))):
        row = PredictionRow(pid, "m", "1", 0, at, 0, 0.0, None, p, zb, "online", temperature=temperature)
        if i % 3 == 0:
            row = row._replace(
                set_members=bytes([i % 256, 1]), set_coverage=0.9, set_method="raps", set_randomized=bool(i % 2)
            )
        if i % 6 == 0:
            row = row._replace(priors_version="p-7")
        rows.append(row)
    return rows


def test_a_row_reads_back_as_it_was_served(database_url):
    store = Store(database_url)
    rows = _served(300) + _served(50, temperature=None, seed=1)  # None: a calibration that is no temperature
    rows += [r._replace(source=OFFLINE, logits=None, temperature=None) for r in _served(20, seed=2)]
    store.predictions.insert(rows)
    found = store.predictions.fetch([r.id for r in rows] + ["0" * 32, "not an id"])
    assert set(found) == {r.id for r in rows}
    recovered = []
    for r in rows:
        back = found[r.id]
        probs = np.frombuffer(r.probabilities, np.float32)
        assert back.probabilities == r.probabilities and back.source == r.source
        assert (back.model, back.version, back.calibration_version) == ("m", "1", 0)
        assert back.predicted == int(probs.argmax()) and back.confidence == float(probs.max())
        assert back.created_at == int(r.id[:12], 16) / 1000
        sets = ("set_members", "set_coverage", "set_method", "set_randomized", "set_probabilities", "priors_version")
        assert [getattr(back, f) for f in sets] == [getattr(r, f) for f in sets]
        if r.logits is None:
            assert back.logits is None
            continue
        z, zb = np.frombuffer(r.logits, np.float32), np.frombuffer(back.logits, np.float32)
        np.testing.assert_allclose(zb - zb.max(), z - z.max(), atol=1e-5 * (1 + np.abs(z).max()))
        recovered.append(back.logits != r.logits)
    with store.db.engine.connect() as c:
        stored = c.execute(sa.select(sa.func.count(prediction_log.c.logits))).scalar_one()
    # logits kept: no temperature (50), underflowed probabilities (30 of 300); offline rows have none
    assert stored == 50 + 30 and sum(recovered) == 300 - 30
    # a refit from the logits read back finds the temperature a refit from the served ones finds
    y = np.random.default_rng(3).integers(0, 10, 300)
    served = np.array([np.frombuffer(r.logits, np.float32) for r in rows[:300]], dtype=np.float64)
    back = np.array([np.frombuffer(found[r.id].logits, np.float32) for r in rows[:300]], dtype=np.float64)
    assert fit_temperature(back, y) == pytest.approx(fit_temperature(served, y), rel=1e-5)
    store.db.engine.dispose()


def _captured(engine: sa.Engine) -> list[str]:
    """Every statement the engine sends from now on."""
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: sent.append(statement))
    return sent


def _labelled(store: Store, rows: list[PredictionRow]) -> None:
    store.labels.insert(
        [LabelRow(r.id, "m", "1", 0, 1, 1, 0.9, 13, 0.1, 0.01, r.created_at, r.probabilities) for r in rows]
    )


def test_retention_drops_partitions_and_never_deletes_from_the_log(pg_url):
    store = Store(pg_url)
    days = [_served(40, seed=d, at=NOW - d * DAY) for d in range(5)]  # today and the four days before
    for rows in days:
        store.predictions.insert(rows)
        _labelled(store, rows[:4])
    sent = _captured(store.db.engine)
    done = store.upkeep(retention_seconds=2.5 * DAY, now=NOW)
    assert done is not None
    # the cutoff falls in the day of NOW - 3 days: that day's partition and older ones are kept whole until they end
    gone = {partitions.partition_of(NOW - d * DAY).name for d in (4,)}
    assert set(done.dropped) == gone and done.labels == 4 and done.deleted == 0
    assert not [s for s in sent if _TOUCHES_LOG_ROWS.search(s)]  # no read, update or delete of the log's rows
    assert [s for s in sent if "DETACH PARTITION" in s]
    with store.db.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(prediction_log)).scalar_one() == 4 * 40
        assert c.execute(sa.select(sa.func.count()).select_from(labels)).scalar_one() == 4 * 4
        names = {p.name for p in partitions.existing(c)}
        assert not names & gone and partitions.partition_of(NOW + partitions.AHEAD * DAY).name in names
        # the labels' range delete walks their unique index (a table this small is scanned whole by choice, so the
        # planner is told to use the index if there is one)
        c.exec_driver_sql("SET enable_seqscan = off")
        bound = prediction_ids(1, at=NOW)[0]
        plan = "\n".join(r[0] for r in c.exec_driver_sql(f"EXPLAIN DELETE FROM labels WHERE prediction_id < '{bound}'"))
        assert "labels_prediction_id_key" in plan, plan
    store.db.engine.dispose()


def test_sqlite_retention_deletes_by_a_range_of_the_primary_key(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'log.db'}")
    old, new = _served(30, at=NOW - 3 * DAY), _served(30, seed=1, at=NOW)
    store.predictions.insert(old + new)
    sent = _captured(store.db.engine)
    done = store.upkeep(retention_seconds=2 * DAY, now=NOW)
    assert done is not None and done.deleted == 30 and not done.dropped
    with store.db.engine.connect() as c:
        for statement in [s for s in sent if s.lstrip().upper().startswith("DELETE FROM PREDICTION_LOG")]:
            plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, (1, b"\0" * 16)))
            assert "SEARCH" in plan and "PRIMARY KEY" in plan, plan
        assert c.execute(sa.select(sa.func.count()).select_from(prediction_log)).scalar_one() == 30
    assert set(store.predictions.fetch([r.id for r in old + new])) == {r.id for r in new}
    store.db.engine.dispose()


def test_one_replica_at_a_time_does_the_upkeep_and_both_keep_serving(pg_url):
    first, second = Store(pg_url), Store(pg_url)
    first.db.migrate()
    taken, release = threading.Event(), threading.Event()

    def hold_the_turn():
        with locks.maintenance_turn(first.db.engine) as turn:
            assert turn
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    assert taken.wait(10)
    try:
        assert second.upkeep(retention_seconds=30 * DAY) is None  # the other replica has the turn
        rows = _served(10, at=NOW)
        second.predictions.insert(rows)  # both serve meanwhile
        assert set(first.predictions.fetch([r.id for r in rows])) == {r.id for r in rows}
    finally:
        release.set()
        holder.join(10)
    assert second.upkeep(retention_seconds=30 * DAY) is not None  # the turn is free again
    first.db.engine.dispose()
    second.db.engine.dispose()


def test_a_label_joins_its_prediction_until_the_prediction_partition_expires(repository_dir, server_for, pg_url):
    """A prediction older than the retention period but in a partition that has not ended before the cutoff is
    still stored, and its label joins; once the partition is dropped, a label is refused as beyond retention."""
    retention = 2.0
    cutoff = time.time() - retention * DAY
    oldest = partitions.partition_of(cutoff)  # ends after the cutoff: kept whole until it ends
    kept_at = (oldest.start + cutoff) / 2  # older than the retention period, in that partition
    store = Store(pg_url)
    rows = [r._replace(model="digits-lenet5") for r in _served(2, at=kept_at)]
    store.predictions.insert(rows)
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": pg_url, "retention_days": retention},
    )
    with server_for(settings) as (base_url, _):
        joined = loopback.post(f"{base_url}/feedback", json={"items": [{"prediction_id": rows[0].id, "label": 3}]})
        assert joined.json()["accepted"] == 1, joined.json()
        done = store.upkeep(retention_seconds=retention * DAY, now=oldest.end + retention * DAY)  # a day later
        assert done is not None and oldest.name in done.dropped
        refused = loopback.post(f"{base_url}/feedback", json={"items": [{"prediction_id": rows[1].id, "label": 3}]})
        assert "beyond the retention period" in refused.json()["rejected"][0]["reason"]
    store.db.engine.dispose()


def test_the_newest_rows_of_a_key_come_from_its_primary_key_range(database_url):
    store = Store(database_url)
    mine = _served(50, at=NOW - 10)
    others = [r._replace(version="2") for r in _served(50, seed=1, at=NOW)]
    store.predictions.insert(mine + others)
    recent = store.predictions.recent(CalibrationKey("m", "1", 0), 20)
    assert recent.newest_id == max(r.id for r in mine)
    expected = sorted(mine, key=lambda r: r.id, reverse=True)[:20]
    np.testing.assert_array_equal(
        recent.probs, np.array([np.frombuffer(r.probabilities, np.float32) for r in expected], dtype=np.float64)
    )
    confidences = store.predictions.recent_confidences(CalibrationKey("m", "1", 0), 20)
    np.testing.assert_array_equal(confidences, recent.probs.max(axis=1))
    store.db.engine.dispose()


def test_a_pass_interrupted_after_a_detach_is_finished_by_the_next(pg_url):
    store = Store(pg_url)
    old = _served(10, at=NOW - 5 * DAY)
    store.predictions.insert(old + _served(10, seed=1, at=NOW))
    part = partitions.partition_of(NOW - 5 * DAY)
    with store.db.engine.begin() as c:  # detached, not dropped: a pass that lost its connection in between
        c.exec_driver_sql(f"ALTER TABLE prediction_log DETACH PARTITION {part.name}")
    done = store.upkeep(retention_seconds=2 * DAY, now=NOW)
    assert done is not None and part.name in done.dropped
    with store.db.engine.connect() as c:
        assert not partitions.detached(c) and part.name not in {p.name for p in partitions.existing(c)}
    store.db.engine.dispose()


def test_the_upkeep_makes_the_days_ahead_whatever_the_retention(pg_url):
    store = Store(pg_url)
    done = store.upkeep(retention_seconds=3650 * DAY, now=NOW)  # ten years: no partition for every day of them
    # yesterday's to the one four days ahead ends in, at most
    assert done is not None and len(done.created) <= partitions.AHEAD + 3 and not done.dropped
    assert done.partitions_end >= partitions.partition_of(NOW + (partitions.AHEAD + 1) * DAY).end
    store.db.engine.dispose()
