"""The shared store: predictions, labels with their block sums, pending labels, calibration versions, alarm and
label-shift state (SQLAlchemy Core on SQLite or PostgreSQL). ``Store`` gathers one object per table family over one
``Database``; every method is blocking (call it from a thread)."""

from __future__ import annotations

from service.store.alarm_state import AlarmStates
from service.store.calibrations import Calibrations
from service.store.coverage import CoverageStates
from service.store.database import Database
from service.store.labels import Labels
from service.store.pending import PendingLabels
from service.store.predictions import Predictions
from service.store.retention import purge
from service.store.shift_state import ShiftStates


class Store:
    def __init__(self, url: str, retry_after: int = 1, timeout: float = 5.0):
        self.db = Database(url, retry_after, timeout)
        self.predictions = Predictions(self.db)
        self.labels = Labels(self.db)
        self.pending = PendingLabels(self.db)
        self.calibrations = Calibrations(self.db)
        self.alarm_states = AlarmStates(self.db)
        self.coverage = CoverageStates(self.db)
        self.shift_states = ShiftStates(self.db)

    def purge(self, older_than: float) -> int:
        """Delete predictions (and their labels) created before ``older_than``, and pending labels received
        before it; returns the count of predictions."""
        return purge(self.db, older_than)
