"""Block sums: each label also adds to its block's per-bin sums (``label_bins``) in the same transaction, so a window
costs per block, not per label."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from service.store.schema import label_bins, labels

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql, sqlite

BLOCK_LABELS = 4096
BLOCK = (labels.c.seq // BLOCK_LABELS).label("block")
ROW_COLUMNS = (
    labels.c.seq,
    labels.c.conf_bin,
    labels.c.confidence,
    labels.c.correct,
    labels.c.nll,
    labels.c.brier,
    labels.c.labelled_at,
)
_SUM_COLUMNS = ("count", "confidence_sum", "correct_sum", "nll_sum", "brier_sum", "first_at", "last_at", "last_seq")
IDS: sa.BindParameter[str] = sa.bindparam("ids", expanding=True)


def in_block(block: int):
    """The WHERE term of the labels of ``block``."""
    return labels.c.seq.between(block * BLOCK_LABELS, (block + 1) * BLOCK_LABELS - 1)


def _row_sums(r) -> tuple:
    """The sums ``_SUM_COLUMNS`` over label rows ``r`` (the columns of ``labels`` or of a subquery of it)."""
    return (
        sa.func.count(),
        sa.func.sum(r.confidence),
        sa.func.sum(r.correct),
        sa.func.sum(r.nll),
        sa.func.sum(r.brier),
        sa.func.min(r.labelled_at),
        sa.func.max(r.labelled_at),
        sa.func.max(r.seq),
    )


def block_sums(*where) -> sa.Select:
    """The ``label_bins`` rows of the labels matching ``where``: sums per key, block and confidence bin."""
    keys = (labels.c.model, labels.c.version, labels.c.calibration_version, BLOCK, labels.c.conf_bin)
    return sa.select(*keys, *_row_sums(labels.c)).where(*where).group_by(*keys)


def add_to_blocks(c: sa.Connection, sums: sa.Select) -> None:
    """Add ``sums`` into ``label_bins`` (an upsert: concurrent writers add, never overwrite)."""
    c.execute(_block_upsert(c.dialect.name, sums))


def _block_upsert(dialect: str, sums: sa.Select):
    """The statement adding ``sums`` into ``label_bins`` on ``dialect``."""
    insert: Callable[[sa.Table], sqlite.Insert | postgresql.Insert]
    least: Callable[..., sa.ColumnElement[Any]]
    greatest: Callable[..., sa.ColumnElement[Any]]
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        least, greatest = sa.func.min, sa.func.max
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        least, greatest = sa.func.least, sa.func.greatest
    else:
        raise RuntimeError(f"the feedback store supports SQLite and PostgreSQL, not {dialect}")
    keys = ("model", "version", "calibration_version", "block", "conf_bin")
    statement = insert(label_bins).from_select([*keys, *_SUM_COLUMNS], sums)
    old, new = label_bins.c, statement.excluded
    return statement.on_conflict_do_update(
        index_elements=list(keys),
        set_={
            **{name: old[name] + new[name] for name in _SUM_COLUMNS[:5]},
            "first_at": least(old.first_at, new.first_at),
            "last_at": greatest(old.last_at, new.last_at),
            "last_seq": greatest(old.last_seq, new.last_seq),
        },
    )


@functools.cache
def labels_to_blocks(dialect: str):
    """The upsert adding the labels of the prediction ids ``ids`` (given at execution) to their blocks, built once
    per dialect (building costs more than running it)."""
    return _block_upsert(dialect, block_sums(labels.c.prediction_id.in_(IDS)))


def bin_totals(*where) -> sa.Select:
    """Per-bin totals of the ``label_bins`` rows matching ``where``, in ``WindowSums.add`` order."""
    b = label_bins.c
    return (
        sa.select(
            b.conf_bin,
            sa.func.sum(b.count),
            sa.func.sum(b.confidence_sum),
            sa.func.sum(b.correct_sum),
            sa.func.sum(b.nll_sum),
            sa.func.sum(b.brier_sum),
            sa.func.min(b.first_at),
            sa.func.max(b.last_at),
            sa.func.max(b.last_seq),
        )
        .where(*where)
        .group_by(b.conf_bin)
    )


def row_totals(rows: sa.Subquery, *by) -> sa.Select:
    """Per-bin totals of label rows (a subquery of ``ROW_COLUMNS``), as ``bin_totals``; per ``by`` too, leading."""
    return sa.select(*by, rows.c.conf_bin, *_row_sums(rows.c)).group_by(*by, rows.c.conf_bin)
