"""The label-shift alarm's read of the prediction log: served predictions after a cursor, oldest first, offline rows
left out, and samples chosen by the ids' random bits."""

from __future__ import annotations

import numpy as np

from service.store import Store
from service.store.predictions import SHARES
from service.store.rows import OFFLINE, CalibrationKey, PredictionRow, encode_rows, prediction_ids

KEY = CalibrationKey("m", "1", 0)


def _store(tmp_path, n: int = 4000) -> tuple[Store, list[str], np.ndarray]:
    store = Store(f"sqlite:///{tmp_path / 'log.db'}")
    probs = np.random.default_rng(0).dirichlet(np.ones(3), n)
    ids, blobs = prediction_ids(n), encode_rows(probs)
    rows = [
        PredictionRow(
            ids[i], "m", "1", 0, 1000.0 + i // 10, 0, 0.5, None, blobs[i], None, OFFLINE if i % 7 == 0 else "online"
        )
        for i in range(n)
    ]
    store.predictions.insert(rows)
    return store, ids, probs


def test_the_read_resumes_after_its_cursor_and_skips_offline_rows(tmp_path):
    store, ids, probs = _store(tmp_path)
    online = [i for i in range(len(ids)) if i % 7]
    order = sorted(online, key=lambda i: (1000.0 + i // 10, ids[i]))
    with store.db.unit() as c:
        assert store.predictions.count_served(KEY, None, 1199.0, c) == sum(1000 + i // 10 <= 1199 for i in online)
        first = store.predictions.served_after(KEY, None, 1399.0, 500, c)
        assert first.last == (1000.0 + order[499] // 10, ids[order[499]])  # the limit stopped it
        np.testing.assert_allclose(first.probs, probs[order[:500]], atol=1e-7)
        rest = store.predictions.served_after(KEY, first.last, 1399.0, 10**6, c)
        assert rest.last == (1399.0, "~")  # everything up to ``until`` looked at
        assert len(first.probs) + len(rest.probs) == len(online)
        assert store.predictions.count_served(KEY, rest.last, 1399.0, c) == 0


def test_a_share_is_a_sample_by_the_ids_random_bits(tmp_path):
    store, ids, _ = _store(tmp_path)
    with store.db.unit() as c:
        everything = store.predictions.served_after(KEY, None, 1399.0, 10**6, c)
        quarter = store.predictions.served_after(KEY, None, 1399.0, 10**6, c, share=SHARES // 4)
    kept = [i for i in range(len(ids)) if i % 7 and ids[i][12:14] < "40"]
    assert len(quarter.probs) == len(kept) and quarter.last == everything.last
    assert 0.2 < len(kept) / len(everything.probs) < 0.3
