"""The prediction log's table: every served prediction, written in bulk by ``service.serving.prediction_log``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa

from service.store.blocks import IDS
from service.store.bulk import BulkInsert
from service.store.database import Database
from service.store.rows import OFFLINE, CalibrationKey, PredictionRow
from service.store.schema import predictions, scope

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
