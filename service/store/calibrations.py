"""Calibration versions: 0 is the manifest's temperature, refits count up; one is active."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence

import sqlalchemy as sa

from service.store import locks
from service.store.database import Database
from service.store.schema import calibrations, of_version

_of = functools.partial(of_version, calibrations)  # a model version's rows of the calibrations table


def _first(c: sa.Connection, model: str, version: str, *where) -> int | None:
    """The first calibration version of a model version matching ``where`` (None: none does)."""
    return c.execute(sa.select(calibrations.c.calibration_version).where(*_of(model, version), *where)).scalar()


def _insert(c: sa.Connection, model: str, version: str, details: dict, **values) -> None:
    """Record a calibration version of a model version (its ``values``, ``details`` as JSON), made now."""
    row = dict(model=model, version=version, created_at=time.time(), details=json.dumps(details))
    c.execute(calibrations.insert().values(**row, **values))


class Calibrations:
    def __init__(self, db: Database):
        self.db = db

    def of(self, model: str, version: str) -> Sequence[sa.Row]:
        """Every calibration version of a model version, oldest first."""
        query = sa.select(calibrations).where(*_of(model, version)).order_by(calibrations.c.calibration_version)
        return self.db.run(lambda c: c.execute(query).all(), write=False)

    def active(self) -> Sequence[sa.Row]:
        """The active calibration version of every model version that has one."""
        return self.db.run(lambda c: c.execute(sa.select(calibrations).where(calibrations.c.active)).all(), write=False)

    def ensure_manifest(self, model: str, version: str, method: str, temperature: float | None) -> None:
        """Record calibration version 0 (the one in the manifest) once, active unless another is."""

        def work(c):
            if _first(c, model, version, calibrations.c.calibration_version == 0) is None:
                active = _first(c, model, version, calibrations.c.active) is None
                row = dict(method=method, temperature=temperature, source="manifest", active=active)
                _insert(c, model, version, {}, calibration_version=0, **row)

        self._write(work)

    def add(self, model: str, version: str, temperature: float, details: dict) -> int:
        """Record a refitted temperature as a new active calibration version; returns its number."""

        def work(c):
            latest = c.execute(sa.select(sa.func.max(calibrations.c.calibration_version)).where(*_of(model, version)))
            new = (latest.scalar() or 0) + 1
            c.execute(calibrations.update().where(*_of(model, version)).values(active=False))
            row = dict(method="temperature", temperature=temperature, source="refit", active=True)
            _insert(c, model, version, details, calibration_version=new, **row)
            return new

        return self._write(work)

    def activate(self, model: str, version: str, calibration_version: int) -> bool:
        """Make ``calibration_version`` the active one; False when it does not exist."""
        chosen = calibrations.c.calibration_version == calibration_version

        def work(c):
            if _first(c, model, version, chosen) is None:
                return False
            c.execute(calibrations.update().where(*_of(model, version)).values(active=chosen))
            return True

        return self._write(work)

    def _write(self, work):
        """``work(connection)`` in one unit of work that first takes the calibrations' advisory lock: every write
        goes through here, so none can read-then-write outside it."""

        def locked(c):
            locks.advisory_lock(c, locks.CALIBRATIONS)
            return work(c)

        return self.db.run(locked)
