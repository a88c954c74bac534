"""Schema creation and upgrade, run by every replica at start (and by its first unit of work after a store
outage). Replicas that start together take turns: on PostgreSQL the whole migration holds a transaction-level
advisory lock, so one of them creates or upgrades the schema and the others, waiting on the lock, find it done.
(An SQLite file is one replica's store; a second process that races it fails its first migration with
StorageUnavailable and migrates on its next unit of work.)"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from service.store import locks
from service.store.blocks import add_to_blocks, block_sums
from service.store.schema import (
    SCHEMA_VERSION,
    label_bins,
    labels,
    metadata,
    monitor_state,
    pending_labels,
    predictions,
    schema_info,
)

log = logging.getLogger("service.store")


def migrate(connection: sa.Connection) -> None:
    """Create the schema (idempotent) and record its version; refuse a newer schema. Version 1 had
    neither block sums nor the served probabilities on labels: the replica that moves the version to 2
    adds the columns, copies them from the predictions and builds ``label_bins``. Call inside the
    transaction that commits the migration: the lock is held until it ends."""
    locks.advisory_lock(connection, locks.MIGRATION)
    metadata.create_all(connection)
    found = connection.execute(sa.select(sa.func.max(schema_info.c.version))).scalar()
    if found is None:
        connection.execute(schema_info.insert().values(version=SCHEMA_VERSION))
        log.info("schema created at version %d", SCHEMA_VERSION)
    elif found > SCHEMA_VERSION:
        raise RuntimeError(f"database schema version {found} is newer than this service ({SCHEMA_VERSION})")
    elif (
        found == 1
        and connection.execute(schema_info.update().where(schema_info.c.version == 1).values(version=2)).rowcount
    ):
        _labels_to_v2(connection)
        log.info("schema migrated from version 1 to %d", SCHEMA_VERSION)
    _add_columns(connection)


def _add_columns(c: sa.Connection) -> None:
    """Nullable columns added to tables of an existing store (older versions ignore them): the source of
    labels and pending labels, the prediction sets of predictions and labels, the interval checks of the monitor
    state; and indexes added since (and the one they replaced)."""
    for table in (labels, pending_labels, predictions, monitor_state):
        present = {column["name"] for column in sa.inspect(c).get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                c.exec_driver_sql(
                    f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column.type.compile(dialect=c.dialect)}"
                )
                log.info("added column %s.%s", table.name, column.name)
        for index in table.indexes:
            index.create(c, checkfirst=True)
    # the first version with sets indexed every label for them; ``ix_labels_covered`` holds only those with one
    c.exec_driver_sql("DROP INDEX IF EXISTS ix_labels_sets")


def _labels_to_v2(c: sa.Connection) -> None:
    """Schema version 1 -> 2: the served probabilities and logits on every label, and the block sums."""
    present = {column["name"] for column in sa.inspect(c).get_columns("labels")}
    binary = sa.LargeBinary().compile(dialect=c.dialect)
    for name in ("probabilities", "logits"):
        if name not in present:
            c.exec_driver_sql(f"ALTER TABLE labels ADD COLUMN {name} {binary}")
    served = {
        name: sa.select(predictions.c[name]).where(predictions.c.id == labels.c.prediction_id).scalar_subquery()
        for name in ("probabilities", "logits")
    }
    c.execute(labels.update().values(**served))
    c.execute(label_bins.delete())
    add_to_blocks(c, block_sums(sa.true()))
