"""Schema creation and upgrade, run by every replica at start (and after a store outage). On PostgreSQL the
migration holds a transaction-level advisory lock, so replicas that start together take turns and find it done."""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from service.store import legacy, locks, partitions
from service.store.blocks import add_to_blocks, block_sums
from service.store.rows import last_id
from service.store.schema import (
    SCHEMA_VERSION,
    label_bins,
    labels,
    metadata,
    monitor_state,
    pending_labels,
    schema_info,
    shift_state,
)

log = logging.getLogger("service.store")


def migrate(connection: sa.Connection, now: float | None = None) -> None:
    """Create or upgrade the schema and record its version, refusing a newer one; call inside the transaction."""
    locks.advisory_lock(connection, locks.MIGRATION)
    metadata.create_all(connection)
    found = connection.execute(sa.select(sa.func.max(schema_info.c.version))).scalar()
    if found is None:
        connection.execute(schema_info.insert().values(version=SCHEMA_VERSION))
        log.info("schema created at version %d", SCHEMA_VERSION)
    elif found > SCHEMA_VERSION:
        raise RuntimeError(f"database schema version {found} is newer than this service ({SCHEMA_VERSION})")
    else:
        for step, upgrade in ((1, _labels_to_v2), (2, _log_to_v3)):
            if found <= step and _advance(connection, step):
                upgrade(connection)
                log.info("schema migrated from version %d to %d", step, step + 1)
    _add_columns(connection)
    if connection.dialect.name == "postgresql":
        now = time.time() if now is None else now
        partitions.make_ahead(connection, now)


def _advance(c: sa.Connection, step: int) -> bool:
    """Move the recorded version from ``step`` to ``step + 1``; whether this transaction did."""
    return bool(c.execute(schema_info.update().where(schema_info.c.version == step).values(version=step + 1)).rowcount)


def _add_columns(c: sa.Connection) -> None:
    """Add the nullable columns and indexes added since (older versions ignore them)."""
    tables = [labels, pending_labels, monitor_state] + ([legacy.predictions] if legacy.present(c) else [])
    for table in tables:
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
    old_log = legacy.predictions
    served = {
        name: sa.select(old_log.c[name]).where(old_log.c.id == labels.c.prediction_id).scalar_subquery()
        for name in ("probabilities", "logits")
    }
    c.execute(labels.update().values(**served))
    c.execute(label_bins.delete())
    add_to_blocks(c, block_sums(sa.true()))


def _log_to_v3(c: sa.Connection) -> None:
    """Schema version 2 -> 3: labels lose their foreign key to ``predictions``; ids take 16 bytes."""
    if any(fk["referred_table"] == legacy.predictions.name for fk in sa.inspect(c).get_foreign_keys(labels.name)):
        if c.dialect.name == "postgresql":
            for fk in sa.inspect(c).get_foreign_keys(labels.name):
                c.exec_driver_sql(f'ALTER TABLE {labels.name} DROP CONSTRAINT "{fk["name"]}"')
        else:
            _rebuild_sqlite_labels(c)
    c.exec_driver_sql("DROP INDEX IF EXISTS ix_predictions_model_time")  # the old log is read by its key alone now
    past = sa.text("SELECT model, version, calibration_version, cursor_at FROM shift_state WHERE cursor_id = '~'")
    moved = sa.text(
        "UPDATE shift_state SET cursor_id = :cursor "
        "WHERE model = :model AND version = :version AND calibration_version = :calibration_version"
    ).bindparams(sa.bindparam("cursor", type_=sa.String))
    for model, version, calibration_version, at in c.execute(past).all():
        values = dict(model=model, version=version, calibration_version=calibration_version)
        c.execute(moved, values | {"cursor": last_id(at)})
    for table, column in ((labels, "prediction_id"), (pending_labels, "prediction_id"), (shift_state, "cursor_id")):
        _ids_to_bytes(c, table.name, column, checked=table is not pending_labels)


def _ids_to_bytes(c: sa.Connection, table: str, column: str, checked: bool) -> None:
    """Store the 32-hex-digit ids of ``table.column`` in 16 bytes (PostgreSQL's uuid, SQLite's BLOB), unless done;
    unless ``checked`` (made by the service), rows whose id is no prediction id go first."""
    if c.dialect.name == "postgresql":
        kind = next(col["type"] for col in sa.inspect(c).get_columns(table) if col["name"] == column)
        if isinstance(kind, sa.String):
            if not checked:
                c.exec_driver_sql(f"DELETE FROM {table} WHERE {column} !~ '^[0-9a-f]{{32}}$'")
            c.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE uuid USING {column}::uuid")
        return
    driver = c.connection.driver_connection
    assert driver is not None
    driver.create_function("calib_unhex", 1, bytes.fromhex, deterministic=True)
    if not checked:
        c.exec_driver_sql(
            f"DELETE FROM {table} WHERE typeof({column}) = 'text' "
            f"AND (length({column}) != 32 OR {column} GLOB '*[^0-9a-f]*')"
        )
    c.exec_driver_sql(f"UPDATE {table} SET {column} = calib_unhex({column}) WHERE typeof({column}) = 'text'")


def _rebuild_sqlite_labels(c: sa.Connection) -> None:
    """SQLite's way to change a table's constraints ("Making Other Kinds Of Table Schema Changes"): a new table."""
    ddl = str(sa.schema.CreateTable(labels).compile(dialect=c.dialect))
    c.exec_driver_sql(ddl.replace(f"CREATE TABLE {labels.name} ", "CREATE TABLE labels_v3 ", 1))
    present = {column["name"] for column in sa.inspect(c).get_columns(labels.name)}
    columns = ", ".join(column.name for column in labels.columns if column.name in present)
    c.exec_driver_sql(f"INSERT INTO labels_v3 ({columns}) SELECT {columns} FROM {labels.name}")
    c.exec_driver_sql(f"DROP TABLE {labels.name}")
    c.exec_driver_sql(f"ALTER TABLE labels_v3 RENAME TO {labels.name}")
    for index in labels.indexes:
        index.create(c, checkfirst=True)
