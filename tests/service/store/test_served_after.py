"""The label-shift alarm's read of the prediction log: served predictions after a cursor id, oldest first, offline
rows left out, and samples chosen by the ids' random bits, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest

from service.store import Store
from service.store.predictions import SHARES
from service.store.rows import OFFLINE, CalibrationKey, PredictionRow, encode_rows, last_id, prediction_ids

KEY = CalibrationKey("m", "1", 0)
T0 = 1_790_000_000.0


@pytest.fixture
def filled(database_url):
    store = Store(database_url)
    n = 4000
    probs = np.random.default_rng(0).dirichlet(np.ones(3), n)
    ids = [prediction_ids(1, at=T0 + i // 10)[0] for i in range(n)]
    blobs = encode_rows(probs)
    rows = [
        PredictionRow(ids[i], "m", "1", 0, 0.0, 0, 0.5, None, blobs[i], None, OFFLINE if i % 7 == 0 else "online")
        for i in range(n)
    ]
    store.predictions.insert(rows)
    yield store, ids, probs
    store.db.engine.dispose()


def test_the_read_resumes_after_its_cursor_and_skips_offline_rows(filled):
    store, ids, probs = filled
    online = [i for i in range(len(ids)) if i % 7]
    order = sorted(online, key=lambda i: ids[i])
    with store.db.unit() as c:
        assert store.predictions.count_served(KEY, None, T0 + 199, c) == sum(i // 10 <= 199 for i in online)
        first = store.predictions.served_after(KEY, None, T0 + 399, 500, c)
        assert first.last == ids[order[499]]  # the limit stopped it
        np.testing.assert_allclose(first.probs, probs[order[:500]], atol=1e-7)
        rest = store.predictions.served_after(KEY, first.last, T0 + 399, 10**6, c)
        assert rest.last == last_id(T0 + 399)  # everything up to ``until`` looked at
        assert len(first.probs) + len(rest.probs) == len(online)
        assert store.predictions.count_served(KEY, rest.last, T0 + 399, c) == 0
        assert store.predictions.count_served(CalibrationKey("m", "1", 1), None, T0 + 399, c) == 0  # no such key


def test_a_share_is_a_sample_by_the_ids_random_bits(filled):
    store, ids, _ = filled
    with store.db.unit() as c:
        everything = store.predictions.served_after(KEY, None, T0 + 399, 10**6, c)
        quarter = store.predictions.served_after(KEY, None, T0 + 399, 10**6, c, share=SHARES // 4)
    kept = [i for i in range(len(ids)) if i % 7 and ids[i][12:14] < "40"]
    assert len(quarter.probs) == len(kept) and quarter.last == everything.last
    assert 0.2 < len(kept) / len(everything.probs) < 0.3


def test_the_count_stops_at_its_cap(filled):
    store, ids, _ = filled
    with store.db.unit() as c:
        everything = store.predictions.count_served(KEY, None, T0 + 399, c)
        assert store.predictions.count_served(KEY, None, T0 + 399, c, cap=100) == 100
        assert store.predictions.count_served(KEY, None, T0 + 399, c, cap=everything + 5) == everything
