"""The prediction log of schema versions 1 and 2, ``predictions``, kept readable until maintenance moved its rows."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from service.store import schema
from service.store.blocks import IDS
from service.store.rows import PredictionRow

legacy_metadata = sa.MetaData()

#: The version-2 table, as it was (its index aside).
predictions = sa.Table(
    "predictions",
    legacy_metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Column("calibration_version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("predicted", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("uncalibrated_confidence", sa.Float),
    sa.Column("probabilities", sa.LargeBinary, nullable=False),
    sa.Column("logits", sa.LargeBinary),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("set_members", sa.LargeBinary),
    sa.Column("set_coverage", sa.Float),
    sa.Column("set_method", sa.String(8)),
    sa.Column("set_randomized", sa.Boolean),
    sa.Column("set_probabilities", sa.LargeBinary),
    sa.Column("priors_version", sa.String(64)),
)
FIELDS = [name for name in PredictionRow._fields if name != "temperature"]


def present(c: sa.Connection) -> bool:
    """Whether the store still has the version-2 log."""
    return sa.inspect(c).has_table(predictions.name)


def _rows(found: Sequence[sa.Row]) -> list[PredictionRow]:
    return [PredictionRow(*(getattr(r, name) for name in FIELDS)) for r in found]


def fetch(c: sa.Connection, ids: list[str]) -> dict[str, PredictionRow]:
    """The version-2 rows among ``ids``, by id (through its primary key)."""
    query = sa.select(*(predictions.c[name] for name in FIELDS)).where(predictions.c.id.in_(IDS))
    return {row.id: row for row in _rows(c.execute(query, {"ids": ids}).all())}


def newest(c: sa.Connection, since: str, limit: int) -> list[PredictionRow]:
    """The ``limit`` newest version-2 rows with an id from ``since`` on (ids are time-ordered), newest first."""
    query = (
        sa.select(*(predictions.c[name] for name in FIELDS))
        .where(predictions.c.id >= since)
        .order_by(predictions.c.id.desc())
        .limit(limit)
    )
    return _rows(c.execute(query).all())


def forget(c: sa.Connection, ids: list[str]) -> None:
    """Delete the version-2 rows ``ids`` (converted), through the primary key."""
    c.execute(predictions.delete().where(predictions.c.id.in_(IDS)), {"ids": ids})


def drop(c: sa.Connection) -> None:
    c.exec_driver_sql(f"DROP TABLE IF EXISTS {predictions.name}")


def _with_text_ids(table: sa.Table, column: str) -> sa.Table:
    """``table`` as version 2 had it: ``column``, a prediction id, as 32 hex characters."""
    old = table.to_metadata(legacy_metadata)
    old.c[column].type = sa.String(32)
    return old


labels = _with_text_ids(schema.labels, "prediction_id")
labels.append_constraint(sa.ForeignKeyConstraint(["prediction_id"], ["predictions.id"], ondelete="CASCADE"))
pending_labels = _with_text_ids(schema.pending_labels, "prediction_id")
shift_state = _with_text_ids(schema.shift_state, "cursor_id")


def create_version_2(c: sa.Connection) -> None:
    """The schema at version 2 on an empty database (what migration tests and the store benchmark start from)."""
    legacy_metadata.create_all(c)
    c.exec_driver_sql(
        "CREATE INDEX ix_predictions_model_time ON predictions (model, version, calibration_version, created_at)"
    )
    new = {schema.prediction_log.name, schema.calibration_keys.name, schema.served_choices.name}
    new |= {t.name for t in legacy_metadata.sorted_tables}
    schema.metadata.create_all(c, tables=[t for t in schema.metadata.sorted_tables if t.name not in new])
    c.execute(schema.schema_info.insert().values(version=2))


def insert_version_2_labels(c: sa.Connection, rows: Sequence) -> None:
    """Store label rows (``rows.LabelRow``) as version 2 did, and the block sums again from every label."""
    from service.store.blocks import add_to_blocks, block_sums

    if rows:
        c.execute(labels.insert(), [vars(r) for r in rows])
        c.execute(schema.label_bins.delete())
        add_to_blocks(c, block_sums(sa.true()))
