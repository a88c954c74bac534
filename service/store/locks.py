"""Transaction-level advisory locks: how replicas sharing one PostgreSQL store take turns at writes that read first
or whose order readers rely on; no-ops on SQLite, one replica's store."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

MIGRATION = 0x63616C6962  # the schema's creation and upgrade ("calib")
CALIBRATIONS = 0x63616C6963  # calibration versions: version 0 from the manifest, refits, activation
PENDING_LABELS = 0x63616C6964  # joining pending labels to their predictions
LABELS = 0x63616C6965  # inserting labels: their sequence numbers commit in order
MAINTENANCE = 0x63616C6966  # retention and the prediction log's partitions: one replica at a time


def advisory_lock(connection: sa.Connection, key: int) -> None:
    """Wait (within the transaction's lock_timeout) until no other transaction holds ``key``."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def try_advisory_lock(connection: sa.Connection, key: int) -> bool:
    """Take ``key`` for this transaction if no other transaction holds it; whether it was taken."""
    if connection.dialect.name == "postgresql":
        return bool(connection.execute(sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": key}).scalar_one())
    return True


def locked_row(c: sa.Connection, table: sa.Table, where: Sequence, initial: dict) -> sa.Row:
    """The state row of ``table`` matching ``where``, created with ``initial`` on first use (or by the replica that won
    the race), write-locked by an UPDATE until the transaction ends (a row lock on PostgreSQL, SQLite's write lock)."""
    if not c.execute(table.update().where(*where).values(updated_at=time.time())).rowcount:
        try:
            with c.begin_nested():
                c.execute(table.insert().values(**initial, updated_at=time.time()))
        except IntegrityError:  # another replica created it meanwhile
            c.execute(table.update().where(*where).values(updated_at=time.time()))
    return c.execute(sa.select(table).where(*where).with_for_update()).one()


class LockedRow:
    """A state row of ``table`` (``row``, matching ``where``), write-locked until the unit of work that produced it
    ends; reads that must see the same snapshot pass ``connection`` on."""

    def __init__(self, connection: sa.Connection, table: sa.Table, where: Sequence, initial: dict):
        self.connection, self.table, self.where = connection, table, where
        self.row = locked_row(connection, table, where, initial)

    def update(self, **values) -> None:
        self.connection.execute(self.table.update().where(*self.where).values(**values, updated_at=time.time()))


@contextmanager
def maintenance_turn(engine: sa.Engine) -> Iterator[bool]:
    """Whether this replica has the maintenance turn until the block ends: a session-level advisory lock on a
    connection of its own (the work runs in transactions of its own). Always True on SQLite."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        taken = bool(c.execute(sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": MAINTENANCE}).scalar_one())
        try:
            yield taken
        finally:
            if taken:
                c.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MAINTENANCE})
