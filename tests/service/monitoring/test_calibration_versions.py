"""Calibration versions on a store shared by replicas: replicas that start together record the manifest's
version 0 once, and refits that race get consecutive numbers with exactly one active -- on the real
PostgreSQL, where every writer is its own engine (its own replica)."""

import threading
import time

import pytest
import sqlalchemy as sa

from service.store import Store

pytestmark = pytest.mark.e2e
WRITERS = 8


def _together(pg_url: str, work) -> list:
    """``work(store)`` in WRITERS threads released at once, each with its own engine whose writes to
    ``calibrations`` are slow (50 ms), so every writer has read before the first one writes; their results."""
    stores = [Store(pg_url) for _ in range(WRITERS)]
    for store in stores:
        sa.event.listen(store.db.engine, "before_cursor_execute", _slow_calibration_writes)
    stores[0].db.migrate()
    barrier = threading.Barrier(WRITERS)
    results: list = [None] * WRITERS

    def run(k: int) -> None:
        barrier.wait()
        try:
            results[k] = work(stores[k])
        except Exception as exc:  # noqa: BLE001 -- the assertion below names it
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.db.engine.dispose()
    assert not [r for r in results if isinstance(r, Exception)], results
    return results


def _slow_calibration_writes(_connection, _cursor, statement: str, *_args) -> None:
    if statement.lstrip().upper().startswith(("INSERT INTO CALIBRATIONS", "UPDATE CALIBRATIONS")):
        time.sleep(0.05)


def test_replicas_starting_together_record_the_manifest_calibration_once(pg_url):
    _together(pg_url, lambda store: store.calibrations.ensure_manifest("m", "1", "temperature", 1.5))
    rows = Store(pg_url).calibrations.of("m", "1")
    assert [(r.calibration_version, r.active, r.temperature) for r in rows] == [(0, True, 1.5)]


def test_racing_refits_get_consecutive_versions_and_one_is_active(pg_url):
    store = Store(pg_url)
    store.calibrations.ensure_manifest("m", "1", "temperature", 1.5)
    numbers = _together(pg_url, lambda s: s.calibrations.add("m", "1", 2.0, {"n": 1}))
    assert sorted(numbers) == list(range(1, WRITERS + 1))
    rows = store.calibrations.of("m", "1")
    assert [r.calibration_version for r in rows] == list(range(WRITERS + 1))
    assert [r.calibration_version for r in rows if r.active] == [max(numbers)]
