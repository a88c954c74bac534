"""The write-behind prediction log: flush waits for a batch in flight; full queues and outages are counted."""

import asyncio
import threading
import time

import pytest

from service.errors import Overloaded, StorageUnavailable
from service.metrics import ServiceMetrics
from service.serving.prediction_log import PredictionLog
from service.store.rows import PredictionRow


class SlowStore:
    """Records inserted ids; each insert takes a while; can be made to fail."""

    def __init__(self):
        self.stored: list[str] = []
        self.down = False
        self.lock = threading.Lock()

    @property
    def predictions(self):  # stands in for Store.predictions
        return self

    def insert(self, rows):
        time.sleep(0.05)
        if self.down:
            raise StorageUnavailable("down")
        with self.lock:
            self.stored += [r.id for r in rows]


def _rows(n, start=0):
    return [PredictionRow(f"{i:032x}", "m", "1", 0, 0.0, 0, 0.9, 0.9, b"", None) for i in range(start, start + n)]


def test_flush_waits_for_the_batch_another_task_is_writing():
    async def scenario():
        store = SlowStore()
        log = PredictionLog(store, ServiceMetrics(), batch_size=10)
        log.enqueue(_rows(5))
        writer = asyncio.ensure_future(log.flush())  # takes the rows out of the queue and writes them
        await asyncio.sleep(0.01)  # the queue is empty now, the insert still running
        assert log.pending == 0 and store.stored == []
        await log.flush()
        stored_when_flush_returned = list(store.stored)
        await writer
        return stored_when_flush_returned

    assert len(asyncio.run(scenario())) == 5


def test_outage_keeps_rows_until_the_queue_is_full_then_counts_drops():
    async def scenario():
        store, metrics = SlowStore(), ServiceMetrics()
        log = PredictionLog(store, metrics, max_pending=100, batch_size=50)
        store.down = True
        log.enqueue(_rows(80))
        with pytest.raises(StorageUnavailable):
            await log.flush()
        assert log.pending == 80 and store.stored == []
        log.enqueue(_rows(30, start=80))
        store.down = False
        await log.flush()
        dropped = metrics.log_dropped.labels("queue_full")._value.get()
        return store.stored, dropped

    stored, dropped = asyncio.run(scenario())
    assert len(stored) == 100 and dropped == 10


class BatchRecorder(SlowStore):
    """A SlowStore that also records the length of every batch written."""

    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def insert(self, rows):
        super().insert(rows)
        self.batches.append(len(rows))


def test_under_load_the_writer_sends_full_batches_and_the_remainder_after_the_interval():
    """Rows queued while a full batch is written wait for the next full batch (or the interval),
    instead of following right away as a small batch of their own."""

    async def scenario():
        store = BatchRecorder()
        log = PredictionLog(store, ServiceMetrics(), batch_size=100, interval=1.0)
        log.start()
        log.enqueue(_rows(100))  # a full batch: written at once
        await asyncio.sleep(0.02)  # ... and still being written (the store takes 50 ms)
        log.enqueue(_rows(30, start=100))
        await asyncio.sleep(0.3)
        after_full_batch = list(store.batches)
        log.enqueue(_rows(70, start=130))  # fills the next batch
        await asyncio.sleep(0.3)
        after_second_batch = list(store.batches)
        log.enqueue(_rows(10, start=200))  # a remainder: written after the interval
        await asyncio.sleep(1.6)
        after_interval = list(store.batches)
        await log.stop()
        return after_full_batch, after_second_batch, after_interval, store.stored

    after_full_batch, after_second_batch, after_interval, stored = asyncio.run(scenario())
    assert after_full_batch == [100]
    assert after_second_batch == [100, 100]
    assert after_interval == [100, 100, 10]
    assert stored == [f"{i:032x}" for i in range(210)]


def test_sqlite_bulk_inserts_use_two_statement_texts_whatever_the_batch_lengths(tmp_path):
    """The driver caches prepared statements by text: one text per batch length would fill its cache
    with statements of thousands of parameters, hundreds of MiB that never come back."""
    import sqlalchemy as sa

    from service.store import Store

    storage = Store(f"sqlite:///{tmp_path / 'log.db'}")
    storage.db.migrate()
    texts = set()
    sa.event.listen(
        storage.db.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *args: (
            texts.add(statement) if "INSERT INTO prediction_log" in statement else None
        ),
    )
    start = 0
    for n in (1, 7, 255, 256, 257, 600, 1999):
        storage.predictions.insert(_rows(n, start))
        start += n
    with storage.db.engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM prediction_log")).scalar() == start
    assert len(texts) == 2
    storage.db.engine.dispose()


def test_bulk_insert_stores_every_field_exactly(database_url):
    """Each bulk path (binary COPY on PostgreSQL, multi-row and single-row INSERTs on SQLite) stores
    the values it was given, NULLs included, for batches around the SQLite chunk size."""
    import numpy as np

    from service.store import Store

    storage = Store(database_url)
    storage.db.migrate()
    rng = np.random.default_rng(0)
    rows = [
        PredictionRow(
            f"{i:032x}",
            "digits-lenet5",
            "7",
            i % 3,
            0.0,  # the time of the id (its first 12 hex digits)
            0,
            0.0,
            None,
            rng.random(10).astype(np.float32).tobytes(),
            None if i % 5 == 0 or i % 2 else rng.random(10).astype(np.float32).tobytes(),  # offline rows have none
            "offline" if i % 2 else "online",
        )
        for i in range(300)
    ]
    storage.predictions.insert(rows)
    stored = storage.predictions.fetch([r.id for r in rows])
    storage.db.engine.dispose()
    for r in rows:
        probs = np.frombuffer(r.probabilities, np.float32)
        k = int(probs.argmax())
        assert stored[r.id] == r._replace(predicted=k, confidence=float(probs[k]))


def test_sync_durability_answers_only_once_the_rows_are_committed_and_503_when_they_cannot_be():
    async def scenario():
        store, metrics = SlowStore(), ServiceMetrics()
        log = PredictionLog(store, metrics, max_pending=100, batch_size=50, interval=10.0, durability="sync")
        log.start()
        first, second = log.enqueue(_rows(3)), log.enqueue(_rows(2, start=3))
        await log.written(second)  # no full batch and a long interval: sync writes at once
        committed = list(store.stored)
        store.down = True
        failed = log.enqueue(_rows(1, start=5))
        try:
            await log.written(failed)
            outcome = "answered"
        except StorageUnavailable:
            outcome = "503"
        await log.written(first)  # already committed: returns at once
        full = log.enqueue(_rows(99, start=6))
        try:
            log.enqueue(_rows(1, start=200))
            refused = False
        except Overloaded:
            refused = True
        store.down = False
        await log.written(full)  # kept through the failure, written in order once the store is back
        await log.stop()
        return committed, outcome, refused, list(store.stored), metrics

    committed, outcome, refused, stored, metrics = asyncio.run(scenario())
    assert committed == [f"{i:032x}" for i in range(5)]
    assert outcome == "503" and refused
    assert stored == [f"{i:032x}" for i in range(105)]
    assert metrics.log_dropped.labels("queue_full")._value.get() == 0


def test_async_durability_never_waits_and_tickets_count_the_rows_queued():
    async def scenario():
        store = SlowStore()
        log = PredictionLog(store, ServiceMetrics(), batch_size=50, interval=10.0)
        log.start()
        tickets = [log.enqueue(_rows(3)), log.enqueue(_rows(4, start=3))]
        await asyncio.sleep(0.2)
        unwritten = list(store.stored)  # write-behind: nothing written before the interval or a full batch
        await log.stop()
        return tickets, unwritten, list(store.stored)

    tickets, unwritten, stored = asyncio.run(scenario())
    assert tickets == [3, 7] and unwritten == [] and len(stored) == 7
