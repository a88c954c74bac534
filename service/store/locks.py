"""Transaction-level advisory locks: how replicas sharing one PostgreSQL store take turns at writes that
read before they write (create-if-missing, next version number). Held until the transaction ends. On SQLite
the lock is a no-op: one file is one replica's store."""

from __future__ import annotations

import sqlalchemy as sa

MIGRATION = 0x63616C6962  # the schema's creation and upgrade ("calib")
CALIBRATIONS = 0x63616C6963  # calibration versions: version 0 from the manifest, refits, activation


def advisory_lock(connection: sa.Connection, key: int) -> None:
    """Wait (within the transaction's lock_timeout) until no other transaction holds ``key``."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
