"""Window statistics from block sums equal the same statistics aggregated over every label row, for
count and time windows across block boundaries, after retention and after migrating a
version-1 store (no block sums) -- on SQLite and on the real PostgreSQL."""

import numpy as np
import pytest
import sqlalchemy as sa

from calibkit import binning
from service.store import Store
from service.store.blocks import BLOCK_LABELS
from service.store.rows import CalibrationKey, LabelRow, PredictionRow, prediction_ids
from service.store.schema import label_bins, labels, schema_info
from tests.service.store.v2_store import version_2_store

KEY = CalibrationKey("m", "1", 0)
N_BINS = 15
EDGES = binning.equal_width_edges(N_BINS)
MIDNIGHT = 1_790_121_600.0  # a UTC day's start: the store's partitions are UTC days
T0 = MIDNIGHT - 1500


def _fill(
    storage: Store, n: int, *, start: int = 0, model: str = "m", t0: float = T0, seed: int = 0, v2: bool = False
) -> None:
    """``n`` labelled predictions, one second apart (their ids of their times), stored in requests of up to 700
    labels (``v2``: into a store as version 2 left it)."""
    rng = np.random.default_rng(seed)
    for offset in range(0, n, 700):
        k = min(700, n - offset)
        conf = rng.uniform(0.1, 1.0, k)
        correct = (rng.random(k) < conf).astype(int)
        at = t0 + start + offset + np.arange(k)
        ids = [prediction_ids(1, at=float(t))[0] for t in at]
        blobs = [np.array([conf[i], 1 - conf[i]], np.float32).tobytes() for i in range(k)]
        preds = [
            PredictionRow(ids[i], model, "1", 0, float(at[i]), 0, float(conf[i]), None, blobs[i], None, "offline")
            for i in range(k)
        ]
        rows = [
            LabelRow(
                ids[i],
                model,
                "1",
                0,
                0,
                int(correct[i]),
                float(conf[i]),
                int(binning.bin_index(conf[i : i + 1], EDGES)[0]),
                float(conf[i]),
                float(1 - conf[i]),
                float(at[i]),
                blobs[i],
            )
            for i in range(k)
        ]
        if v2:
            version_2_store(storage.db.url, preds, rows)
        else:
            storage.labels.insert(rows, preds)


def _brute_force(storage: Store, model: str = "m", *, last: int | None = None, cutoff: float | None = None):
    query = (
        sa.select(
            labels.c.seq, labels.c.conf_bin, labels.c.confidence, labels.c.correct, labels.c.nll, labels.c.labelled_at
        )
        .where(labels.c.model == model)
        .order_by(labels.c.seq.desc())
    )
    if cutoff is not None:
        query = query.where(labels.c.labelled_at >= cutoff)
    if last is not None:
        query = query.limit(last)
    with storage.db.engine.connect() as c:
        rows = c.execute(query).all()
    conf = np.array([r.confidence for r in rows])
    correct = np.array([r.correct for r in rows], dtype=float)
    sums = binning.bin_sums(conf, correct, EDGES)
    return sums, sum(r.nll for r in rows), max((r.seq for r in rows), default=0), len(rows)


def _assert_same(agg, expected) -> None:
    sums, nll, last_seq, n = expected
    assert agg.n == n
    np.testing.assert_allclose(agg.stats.sums.count, sums.count)
    np.testing.assert_allclose(agg.stats.sums.confidence_sum, sums.confidence_sum, rtol=1e-9)
    np.testing.assert_allclose(agg.stats.sums.outcome_sum, sums.outcome_sum)
    assert agg.stats.nll_sum == pytest.approx(nll, rel=1e-9)
    assert agg.last_seq == last_seq


@pytest.fixture
def filled(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    _fill(storage, 3 * BLOCK_LABELS + 300)
    _fill(storage, 500, model="other", seed=1)  # interleaved in the sequence, never counted for "m"
    _fill(storage, 400, start=3 * BLOCK_LABELS + 300, seed=2)
    yield storage
    storage.db.engine.dispose()


def test_count_windows_equal_a_scan_of_every_row(filled):
    total = 3 * BLOCK_LABELS + 700
    for last in (1, 17, 399, 400, 401, BLOCK_LABELS, BLOCK_LABELS + 1, 2500, total - 1, total, total + 10):
        _assert_same(
            filled.labels.window(CalibrationKey("m", "1", 0), N_BINS, last=last), _brute_force(filled, last=last)
        )
    _assert_same(filled.labels.window(CalibrationKey("m", "1", 0), N_BINS), _brute_force(filled))
    with filled.db.engine.connect() as c:  # the block sums really are the source: far fewer rows than labels
        assert c.execute(sa.select(sa.func.count()).select_from(label_bins)).scalar() < total / 10


def test_time_windows_equal_a_scan_of_every_row(filled):
    now = 1000.0 + 3 * BLOCK_LABELS + 700
    for seconds in (0.5, 10, 399.5, 1000, 2047, 2048.5, 5000, 10**6):
        _assert_same(
            filled.labels.window(CalibrationKey("m", "1", 0), N_BINS, seconds=seconds, now=now),
            _brute_force(filled, cutoff=now - seconds),
        )


def test_retention_rebuilds_the_block_sums_it_touches(filled):
    done = filled.upkeep(retention_seconds=86400.0, now=MIDNIGHT + 86400.0)  # the day before MIDNIGHT goes
    assert done is not None and done.labels == 1500 + 500  # labels of both models
    with filled.db.engine.connect() as c:
        assert c.execute(sa.select(sa.func.min(labels.c.labelled_at))).scalar() >= MIDNIGHT
    for last in (100, 2000, 10**6):
        _assert_same(
            filled.labels.window(CalibrationKey("m", "1", 0), N_BINS, last=last), _brute_force(filled, last=last)
        )
    _assert_same(filled.labels.window(CalibrationKey("other", "1", 0), N_BINS), _brute_force(filled, "other"))


def test_a_version_1_store_gets_block_sums_and_served_probabilities_when_migrated(database_url):
    storage = Store(database_url)
    _fill(storage, 2 * BLOCK_LABELS + 5, v2=True)
    with storage.db.engine.begin() as c:  # what a version-1 service left behind: no block sums, no blobs on labels
        c.execute(label_bins.delete())
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN probabilities")
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN logits")
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN source")
        c.execute(schema_info.update().values(version=1))
    fresh = Store(database_url)
    fresh.db.migrate()
    fresh.db.migrate()  # idempotent: a second replica starting does not add the sums twice
    with fresh.db.engine.connect() as c:
        assert c.execute(sa.select(schema_info.c.version)).scalar() == 3
    for last in (10, 1500, None):
        _assert_same(
            fresh.labels.window(CalibrationKey("m", "1", 0), N_BINS, last=last), _brute_force(fresh, last=last)
        )
    rows, _ = fresh.labels.newest(KEY, 50)
    y, probs = rows.y, rows.probs
    assert len(y) == 50 and np.isnan(rows.logits).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)  # copied from the predictions
    # the labels stored before sources existed are the anonymous source's
    assert list(fresh.labels.by_source(KEY, N_BINS)) == ["anonymous"]
    trusted, _ = fresh.labels.newest(KEY, 50, sources=frozenset({"anonymous"}))
    assert list(trusted.seq) == list(rows.seq)
    assert len(fresh.labels.newest(KEY, 50, sources=frozenset({"labeller"}))[0].seq) == 0
    fresh.db.engine.dispose()
    storage.db.engine.dispose()


def test_a_store_without_label_sources_gets_the_columns_and_labels_keep_their_source(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    with storage.db.engine.begin() as c:  # what the previous version left behind
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN source")
        c.exec_driver_sql("ALTER TABLE pending_labels DROP COLUMN source")
    fresh = Store(database_url)
    fresh.db.migrate()
    fresh.db.migrate()  # idempotent
    _fill(fresh, 30)
    rows = [
        LabelRow(f"{i:032x}", "m", "1", 0, 1, 1, 0.9, 13, 0.1, 0.01, 2000.0 + i, source="labeller")
        for i in range(10_000, 10_005)
    ]
    fresh.labels.insert(
        rows, [PredictionRow(r.prediction_id, "m", "1", 0, 2000.0, 1, 0.9, None, b"\0" * 12, None) for r in rows]
    )
    found = fresh.labels.by_source(KEY, N_BINS)
    assert {s: stats.n for s, stats in found.items()} == {"anonymous": 30, "labeller": 5}
    assert found["labeller"].accuracy() == 1.0
    fresh.db.engine.dispose()
    storage.db.engine.dispose()


def test_newest_rows_held_by_the_monitor_equal_a_fresh_fetch(database_url):
    """The monitor holds the newest labelled rows and then reads only the labels that arrived since;
    what it holds equals a fetch of the newest rows from scratch after new labels, after a deletion
    among the rows it holds (a purge), and after more new labels than it holds."""
    from calibkit.alarms import AlarmPolicy
    from service.monitoring import Monitor

    storage = Store(database_url)
    storage.db.migrate()
    monitor = Monitor(
        storage,
        None,
        None,
        n_bins=N_BINS,
        policy=AlarmPolicy(),
        alarm_window="1000",
        detail_rows=300,
        drift_rows=100,
        n_resamples=10,
    )
    reads, fetch = [], storage.labels.newest

    def recorded(*args, **kwargs):
        out = fetch(*args, **kwargs)
        reads.append((kwargs.get("after_seq", 0), len(out[0].seq)))
        return out

    storage.labels.newest = recorded

    def assert_fresh():
        held, (expected, _) = monitor.reports._newest_rows(KEY), fetch(KEY, 300)
        for a, b in zip(held, expected):
            np.testing.assert_array_equal(a, b)
        return held

    _fill(storage, 500)
    assert len(assert_fresh().seq) == 300
    _fill(storage, 40, start=500, seed=1)
    reads.clear()
    assert_fresh()
    assert reads == [(reads[0][0], 40)] and reads[0][0] > 0  # only the 40 new labels were read
    with storage.db.engine.begin() as c:  # a purge deletes some of the rows held
        held_seq = monitor.reports._newest_rows(KEY).seq
        c.execute(labels.delete().where(labels.c.seq.in_([int(s) for s in held_seq[100:110]])))
    reads.clear()
    assert_fresh()
    assert len(reads) == 2 and reads[1] == (0, 300)  # noticed, and refetched whole
    _fill(storage, 700, start=540, seed=2)
    assert_fresh()
    storage.db.engine.dispose()


def test_a_store_without_prediction_set_columns_gets_them_and_their_index(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    _fill(storage, 20)  # rows without sets
    with storage.db.engine.begin() as c:  # what the version before prediction sets left behind
        c.exec_driver_sql("DROP INDEX ix_labels_covered")
        for column in ("covered", "set_size", "set_coverage", "set_method"):
            c.exec_driver_sql(f"ALTER TABLE labels DROP COLUMN {column}")
    fresh = Store(database_url)
    fresh.db.migrate()
    fresh.db.migrate()  # idempotent
    with fresh.db.engine.connect() as c:
        assert "ix_labels_covered" in {i["name"] for i in sa.inspect(c).get_indexes("labels")}
    row = LabelRow(
        prediction_ids(1, at=3000.0)[0],
        "m",
        "1",
        0,
        2,
        1,
        0.9,
        13,
        0.1,
        0.01,
        3000.0,
        None,
        None,
        "anonymous",
        1,
        2,
        0.9,
        "raps",
    )
    prediction = PredictionRow(row.prediction_id, "m", "1", 0, 3000.0, 2, 0.9, None, b"\0" * 12, None, "online")
    fresh.labels.insert([row], [prediction._replace(set_members=b"\x30", set_coverage=0.9, set_method="raps")])
    with fresh.db.engine.connect() as c:
        after = fresh.coverage.labels_after("m", "1", 0, c)
    assert [(r.covered, r.set_method, r.set_coverage) for r in after] == [(1, "raps", 0.9)]  # the old rows have none
    fresh.db.engine.dispose()
    storage.db.engine.dispose()


def test_the_coverage_reads_use_the_index_of_labels_with_a_set_and_an_older_full_index_goes(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    with storage.db.engine.begin() as c:  # what the first version with sets built: every label indexed
        c.exec_driver_sql("CREATE INDEX ix_labels_sets ON labels (model, version, seq)")
    storage.db.migrate()
    with storage.db.engine.connect() as c:
        assert "ix_labels_sets" not in {i["name"] for i in sa.inspect(c).get_indexes("labels")}
        if c.dialect.name == "sqlite":  # PostgreSQL's planner scans a table this small whole, as it should
            # the query of ``CoverageStates.window``
            plan = c.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT set_method, set_coverage, label, set_size, covered FROM labels "
                "WHERE model = 'm' AND version = '1' AND covered IS NOT NULL ORDER BY seq DESC LIMIT 1000"
            ).all()
            assert any("ix_labels_covered" in str(row) for row in plan), plan
    storage.db.engine.dispose()
