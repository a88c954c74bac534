"""The alarm state of every calibration key, shared by all replicas, and the log of its transitions."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from calibkit.alarms import OK
from service.store.database import Database
from service.store.locks import LockedRow
from service.store.rows import CalibrationKey
from service.store.schema import alarm_events, monitor_state, of_version, scope


class LockedAlarmState(LockedRow):
    def save(self, *, state: str, reasons: str, **values) -> None:
        """Store the assessed state; a change of state is also recorded in ``alarm_events``."""
        self.update(state=state, reasons=reasons, **values)
        row = self.row
        if state != row.state:
            key = dict(model=row.model, version=row.version, calibration_version=row.calibration_version)
            event = dict(at=time.time(), from_state=row.state, to_state=state, reasons=reasons)
            self.connection.execute(alarm_events.insert().values(**key, **event))


class AlarmStates:
    def __init__(self, db: Database):
        self.db = db

    @contextmanager
    def locked(self, key: CalibrationKey, new_detector: str) -> Iterator[LockedAlarmState]:
        """A unit of work holding ``key``'s state row write-locked (created with ``new_detector``)."""
        initial = dict(key._asdict(), last_seq=0, detector=new_detector, state=OK, since=None, reasons="[]")
        with self.db.unit() as c:
            yield LockedAlarmState(c, monitor_state, scope(monitor_state, key), initial)

    def all(self) -> Sequence[sa.Row]:
        return self.db.run(lambda c: c.execute(sa.select(monitor_state)).all(), write=False)

    def get(self, key: CalibrationKey) -> sa.Row | None:
        query = sa.select(monitor_state).where(*scope(monitor_state, key))
        return self.db.run(lambda c: c.execute(query).first(), write=False)

    def history(self, model: str, version: str, limit: int = 50) -> Sequence[sa.Row]:
        """The newest ``limit`` transitions of a model version, newest first."""
        query = (
            sa.select(alarm_events)
            .where(*of_version(alarm_events, model, version))
            .order_by(alarm_events.c.id.desc())
            .limit(limit)
        )
        return self.db.run(lambda c: c.execute(query).all(), write=False)
