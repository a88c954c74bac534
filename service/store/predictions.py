"""The prediction log's table: every served prediction, written in bulk by ``service.serving.prediction_log``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa

from service.store.blocks import IDS
from service.store.bulk import BulkInsert
from service.store.database import Database
from service.store.rows import OFFLINE, CalibrationKey, PredictionRow, RecentPredictions, ServedAfter, decode_rows
from service.store.schema import labels, predictions, scope

#: The shares of ``served_after``'s samples: 256ths, from the first two random hex digits of a prediction id.
SHARES = 256
_DRAW = 12  # where the random digits of a prediction id start, after its 12-digit millisecond stamp
_AFTER_ANY_ID = "~"  # sorts after every hex id: a cursor (t, "~") is past every prediction created at t

insert_predictions = BulkInsert(predictions, PredictionRow._fields)
_PREDICTIONS_OF = sa.select(predictions).where(predictions.c.id.in_(IDS))


class Predictions:
    def __init__(self, db: Database):
        self.db = db

    def insert(self, rows: Sequence[PredictionRow]) -> None:
        """Bulk insert in one transaction (see ``BulkInsert``)."""
        if rows:
            self.db.run(lambda c: insert_predictions(c, rows))

    def fetch(self, ids: Iterable[str]) -> dict[str, sa.Row]:
        """The stored predictions among ``ids``, by id."""
        ids = list(ids)
        if not ids:
            return {}
        return self.db.run(lambda c: {row.id: row for row in c.execute(_PREDICTIONS_OF, {"ids": ids})}, write=False)

    def recent_confidences(
        self, key: CalibrationKey, limit: int, connection: sa.Connection | None = None
    ) -> np.ndarray:
        """Calibrated confidences of the most recent predictions the service served (labelled or not): probabilities
        scored elsewhere and sent with their labels (``source`` "offline") are not its traffic, and coming through a
        feedback token, even an untrusted one, they must not move the label-free drift check."""
        query = (
            sa.select(predictions.c.confidence)
            .where(*scope(predictions, key), predictions.c.source != OFFLINE)
            .order_by(predictions.c.created_at.desc())
            .limit(limit)
        )

        def work(c):
            return np.array([r[0] for r in c.execute(query)], dtype=np.float64)

        return work(connection) if connection is not None else self.db.run(work, write=False)

    def recent(self, key: CalibrationKey, limit: int) -> RecentPredictions:
        """The ``limit`` most recent predictions the service served (as ``recent_confidences`` chooses them), newest
        first, with the label of each that has one: the rows of the label-free estimates and of their check. Ordered
        by (time, id), so every replica reading the same store gets the same rows in the same order."""
        served = (*scope(predictions, key), predictions.c.source != OFFLINE)
        # the time of the limit-th newest, read along the (key, created_at) index: the rows from it on are few, so
        # their join and their sort by (time, id) never touch the rest of the log
        oldest = (
            sa.select(predictions.c.created_at)
            .where(*served)
            .order_by(predictions.c.created_at.desc())
            .offset(limit - 1)
            .limit(1)
            .scalar_subquery()
        )
        query = (
            sa.select(predictions.c.id, predictions.c.probabilities, labels.c.label, labels.c.correct)
            .select_from(predictions.outerjoin(labels, labels.c.prediction_id == predictions.c.id))
            .where(*served, predictions.c.created_at >= sa.func.coalesce(oldest, 0.0))
            .order_by(predictions.c.created_at.desc(), predictions.c.id.desc())
            .limit(limit)
        )

        def work(c):
            rows = c.execute(query).all()
            if not rows:
                return RecentPredictions.empty()
            unlabelled = -1
            return RecentPredictions(
                newest_id=rows[0].id,
                probs=decode_rows([r.probabilities for r in rows]),
                label=np.array([unlabelled if r.label is None else r.label for r in rows], dtype=np.int64),
                correct=np.array([-1 if r.correct is None else r.correct for r in rows], dtype=np.int64),
            )

        return self.db.run(work, write=False)

    def served_after(
        self,
        key: CalibrationKey,
        cursor: tuple[float, str] | None,
        until: float,
        limit: int,
        connection: sa.Connection,
        share: int = SHARES,
    ) -> ServedAfter:
        """The predictions the service served after ``cursor`` (created_at, id) and created at or before ``until``,
        oldest first, at most ``limit``: what the label-shift alarm folds next, in an order every replica sees. With
        ``share`` < ``SHARES``, only those whose id's first two random hex digits are below it: a share / 256 sample
        chosen by random bits, whatever the rows hold. ``last`` is where the next call starts: the last row taken
        when ``limit`` stopped the read, else ``until`` (every row up to it looked at)."""
        sample = [] if share >= SHARES else [sa.func.substr(predictions.c.id, _DRAW + 1, 2) < f"{share:02x}"]
        query = (
            sa.select(predictions.c.id, predictions.c.created_at, predictions.c.probabilities)
            .where(*_served_between(key, cursor, until), *sample)
            .order_by(predictions.c.created_at, predictions.c.id)
            .limit(limit)
        )
        rows = connection.execute(query).all()
        last = (float(rows[-1].created_at), rows[-1].id) if len(rows) == limit else (until, _AFTER_ANY_ID)
        return ServedAfter(last, decode_rows([r.probabilities for r in rows]) if rows else np.zeros((0, 0)))

    def count_served(
        self, key: CalibrationKey, cursor: tuple[float, str] | None, until: float, connection: sa.Connection
    ) -> int:
        """How many predictions ``served_after`` would look at (along the (key, created_at) index)."""
        query = sa.select(sa.func.count()).select_from(predictions).where(*_served_between(key, cursor, until))
        return int(connection.execute(query).scalar_one())


def _served_between(key: CalibrationKey, cursor: tuple[float, str] | None, until: float) -> list:
    """The WHERE terms of the served predictions after ``cursor`` (created_at, id), created at or before ``until``."""
    terms = [*scope(predictions, key), predictions.c.source != OFFLINE, predictions.c.created_at <= until]
    if cursor is not None:
        at, pid = cursor
        terms += [  # the first term lets the (key, created_at) index bound the scan
            predictions.c.created_at >= at,
            sa.or_(predictions.c.created_at > at, sa.and_(predictions.c.created_at == at, predictions.c.id > pid)),
        ]
    return terms
