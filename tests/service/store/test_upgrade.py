"""A store of schema version 2 upgrades to the compact, partitioned log without losing a row or a label, on SQLite
and on the real PostgreSQL: readable at once through the old log, moved in the background, the old log dropped once
moved; and a service of version 2 refuses the upgraded store."""

from __future__ import annotations

import time

import numpy as np
import pytest
import sqlalchemy as sa

from calibkit import binning
from calibkit.temperature import apply_temperature
from service.store import Store, legacy, migration
from service.store.pending import PendingLabel
from service.store.rows import OFFLINE, CalibrationKey, LabelRow, PredictionRow, encode_rows, prediction_ids
from service.store.schema import labels, pending_labels, prediction_log, schema_info, shift_state
from tests.service.store.v2_store import version_2_store

DAY = 86400.0
KEY = CalibrationKey("m", "1", 0)
EDGES = binning.equal_width_edges(15)
_STORED = ("id", "model", "version", "calibration_version", "probabilities", "logits", "source", "set_members")
_STORED += ("set_coverage", "set_method", "set_randomized", "set_probabilities", "priors_version")


def _version_2_rows(now: float) -> tuple[list[PredictionRow], list[LabelRow]]:
    """60 predictions a day over the last 7 days as version 2 logged them, every fifth one labelled."""
    rng = np.random.default_rng(0)
    rows, label_rows = [], []
    for day in range(7):
        z = rng.normal(size=(60, 4)) * 3
        probs = apply_temperature(z, 1.5)
        for i, (pid, p, zb) in enumerate(
            zip(prediction_ids(60, at=now - day * DAY - 60), encode_rows(probs), encode_rows(z))
        ):
            k = int(probs[i].argmax())
            row = PredictionRow(pid, "m", "1", 0, now - day * DAY, k, float(probs[i, k]), 0.5, p, zb, "online")
            if i % 3 == 0:
                row = row._replace(set_members=b"\x05", set_coverage=0.9, set_method="lac", set_randomized=False)
            if i % 7 == 0:
                row = row._replace(source=OFFLINE, logits=None)
            rows.append(row)
            if i % 5 == 0:
                y = int(rng.integers(0, 4))
                conf = float(probs[i, k])
                label_rows.append(
                    LabelRow(
                        pid,
                        "m",
                        "1",
                        0,
                        y,
                        int(y == k),
                        conf,
                        int(binning.bin_index(np.array([conf]), EDGES)[0]),
                        float(-np.log(probs[i, y])),
                        0.1,
                        row.created_at + 5,
                        p,
                        row.logits,
                    )
                )
    return rows, label_rows


def _label_ids(url: str) -> set[str]:
    engine = sa.create_engine(url)
    with engine.connect() as c:
        found = {r[0] for r in c.execute(sa.select(labels.c.prediction_id))}
    engine.dispose()
    return found


def test_a_version_2_store_upgrades_without_losing_a_row_or_a_label(database_url):
    now = time.time()
    rows, label_rows = _version_2_rows(now)
    waiting = [PendingLabel(prediction_ids(1)[0], "1", now - 10)]
    version_2_store(database_url, rows, label_rows, waiting)
    engine = sa.create_engine(database_url)
    with engine.begin() as c:  # a label-shift cursor of version 2: past every prediction of its time
        c.execute(
            legacy.shift_state.insert().values(
                **KEY._asdict(), cursor_at=now - 100, cursor_id="~", state="{}", alarmed=False, updated_at=now
            )
        )
    store = Store(database_url)
    store.db.migrate()
    with store.db.engine.connect() as c:
        assert c.execute(sa.select(schema_info.c.version)).scalar_one() == 3
        assert (
            c.execute(sa.select(shift_state.c.cursor_id)).scalar_one() == f"{int((now - 100) * 1000):012x}" + "f" * 20
        )
        assert c.execute(sa.select(sa.func.count()).select_from(pending_labels)).scalar_one() == 1
    # readable at once, through the old log
    before = store.predictions.fetch([r.id for r in rows])
    assert [tuple(getattr(before[r.id], f) for f in _STORED) for r in rows] == [
        tuple(getattr(r, f) for f in _STORED) for r in rows
    ]
    assert _label_ids(database_url) == {r.prediction_id for r in label_rows}
    # the upkeep moves what is within retention (5 days: the rows of days 0 to 4, and on PostgreSQL the rest of the
    # partition the cutoff falls in) and drops the old log with the rest
    done = store.upkeep(retention_seconds=5 * DAY, now=now)
    assert done is not None and done.converted > 0
    with store.db.engine.connect() as c:
        assert not legacy.present(c)
        moved = c.execute(sa.select(sa.func.count()).select_from(prediction_log)).scalar_one()
    assert moved == done.converted
    kept = [r for r in rows if int(r.id[:12], 16) / 1000 >= now - 5 * DAY]
    assert len(kept) == 5 * 60 and len(kept) <= moved < len(rows)
    after = store.predictions.fetch([r.id for r in rows])
    assert {r.id for r in kept} <= set(after)
    for r in rows:
        if r.id in after:
            assert tuple(getattr(after[r.id], f) for f in _STORED) == tuple(getattr(r, f) for f in _STORED)
    # the labels of the predictions kept are all there; those of the ones dropped went with them
    assert _label_ids(database_url) == {lr.prediction_id for lr in label_rows if lr.prediction_id in after}
    window = store.labels.window(KEY, 15)
    remaining = [lr for lr in label_rows if lr.prediction_id in after]
    assert window.n == len(remaining)
    assert window.stats.sums.outcome_sum.sum() == sum(lr.correct for lr in remaining)
    newest = store.predictions.recent(KEY, 30)
    served = sorted((r for r in kept if r.source != OFFLINE), key=lambda r: r.id, reverse=True)[:30]
    assert newest.newest_id == served[0].id
    np.testing.assert_array_equal(newest.probs, np.array([np.frombuffer(r.probabilities, np.float32) for r in served]))
    engine.dispose()
    store.db.engine.dispose()


def test_a_service_of_version_2_refuses_the_upgraded_store(database_url, monkeypatch):
    Store(database_url).db.migrate()
    monkeypatch.setattr(migration, "SCHEMA_VERSION", 2)  # what the version-2 image runs
    with pytest.raises(RuntimeError, match="newer than this service"):
        Store(database_url).db.migrate()
