"""The shared store (SQLAlchemy Core on SQLite or PostgreSQL); every method is blocking."""

from __future__ import annotations

import time

from sqlalchemy.exc import SQLAlchemyError

from service.store.alarm_state import AlarmStates
from service.store.calibrations import Calibrations
from service.store.coverage import CoverageStates
from service.store.database import Database
from service.store.labels import Labels
from service.store.locks import maintenance_turn
from service.store.pending import PendingLabels
from service.store.predictions import Predictions
from service.store.retention import Upkeep, upkeep
from service.store.shift_state import ShiftStates


class Store:
    def __init__(self, url: str, retry_after: int = 1, timeout: float = 5.0):
        self.db = Database(url, retry_after, timeout)
        self.predictions = Predictions(self.db)
        self.labels = Labels(self.db, self.predictions)
        self.pending = PendingLabels(self.db, self.predictions)
        self.calibrations = Calibrations(self.db)
        self.alarm_states = AlarmStates(self.db)
        self.coverage = CoverageStates(self.db)
        self.shift_states = ShiftStates(self.db)

    def upkeep(self, retention_seconds: float, now: float | None = None) -> Upkeep | None:
        """Retention and partitions (``service.store.retention``), unless another replica does them (None)."""
        try:
            with maintenance_turn(self.db.engine) as turn:
                if not turn:
                    return None
                if not self.db.schema_ready:
                    self.db.migrate()
                return upkeep(self.db, self.predictions, time.time() if now is None else now, retention_seconds)
        except SQLAlchemyError as exc:  # the DDL and the turn's lock run outside ``Database.unit``
            raise self.db.unavailable(exc) from exc
