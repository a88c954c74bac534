"""The alarm state of every calibration key (detector, state, reasons), shared by all replicas, and the
log of its transitions."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from calibkit.alarms import OK
from service.store.database import Database
from service.store.locks import locked_row
from service.store.rows import CalibrationKey
from service.store.schema import alarm_events, monitor_state, scope


class LockedAlarmState:
    """One key's state row, write-locked until the unit of work that produced it ends; reads that must see
    the same snapshot pass ``connection`` on."""

    def __init__(self, connection: sa.Connection, key: CalibrationKey, row: sa.Row):
        self.connection, self.key, self.row = connection, key, row

    def save(
        self, *, last_seq: int, detector: str, estimate_checks: str, state: str, since: float | None, reasons: str
    ) -> None:
        """Store the assessed state; a change of state is also recorded in ``alarm_events``."""
        self.connection.execute(
            monitor_state.update()
            .where(*scope(monitor_state, self.key))
            .values(
                last_seq=last_seq,
                detector=detector,
                estimate_checks=estimate_checks,
                state=state,
                since=since,
                reasons=reasons,
                updated_at=time.time(),
            )
        )
        if state != self.row.state:
            self.connection.execute(
                alarm_events.insert().values(
                    **self.key._asdict(), at=time.time(), from_state=self.row.state, to_state=state, reasons=reasons
                )
            )


class AlarmStates:
    def __init__(self, db: Database):
        self.db = db

    @contextmanager
    def locked(self, key: CalibrationKey, new_detector: str) -> Iterator[LockedAlarmState]:
        """A unit of work holding ``key``'s state row write-locked (created with ``new_detector`` on first
        use): the lock is taken first by an UPDATE (a row lock on PostgreSQL, the database write lock on
        SQLite); what is saved commits when the block ends."""
        initial = dict(key._asdict(), last_seq=0, detector=new_detector, state=OK, since=None, reasons="[]")
        with self.db.unit() as c:
            yield LockedAlarmState(c, key, locked_row(c, monitor_state, scope(monitor_state, key), initial))

    def all(self) -> Sequence[sa.Row]:
        return self.db.run(lambda c: c.execute(sa.select(monitor_state)).all(), write=False)

    def get(self, key: CalibrationKey) -> sa.Row | None:
        query = sa.select(monitor_state).where(*scope(monitor_state, key))
        return self.db.run(lambda c: c.execute(query).first(), write=False)

    def history(self, model: str, version: str, limit: int = 50) -> Sequence[sa.Row]:
        """The newest ``limit`` transitions of a model version, newest first."""
        query = (
            sa.select(alarm_events)
            .where(alarm_events.c.model == model, alarm_events.c.version == version)
            .order_by(alarm_events.c.id.desc())
            .limit(limit)
        )
        return self.db.run(lambda c: c.execute(query).all(), write=False)
