"""The label-shift alarm's state per calibration key, shared by all replicas: the alarm folded over the served
predictions up to a cursor, updated under the row's lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from service.store.database import Database
from service.store.locks import LockedRow
from service.store.rows import CalibrationKey, id_time
from service.store.schema import scope, shift_state


class LockedShiftState(LockedRow):
    def save(self, *, cursor: str | None, state: str, alarmed: bool, since: float | None, priors: str | None) -> None:
        at = None if cursor is None else id_time(cursor)
        self.update(cursor_at=at, cursor_id=cursor, state=state, alarmed=alarmed, since=since, priors=priors)


class ShiftStates:
    def __init__(self, db: Database):
        self.db = db

    def get(self, key: CalibrationKey) -> sa.Row | None:
        query = sa.select(shift_state).where(*scope(shift_state, key))
        return self.db.run(lambda c: c.execute(query).first(), write=False)

    @contextmanager
    def locked(self, key: CalibrationKey, fresh: str) -> Iterator[LockedShiftState]:
        """A unit of work holding ``key``'s row write-locked (created ``fresh`` on first use)."""
        initial = dict(key._asdict(), state=fresh, alarmed=False, since=None)
        with self.db.unit() as c:
            yield LockedShiftState(c, shift_state, scope(shift_state, key), initial)
