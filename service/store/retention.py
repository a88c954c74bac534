"""Retention: predictions older than the retention period go, with their labels; the bin sums of the
blocks they touched are rebuilt from the labels left. Pending labels (joined or not) go after the same period."""

from __future__ import annotations

import sqlalchemy as sa

from service.store.blocks import BLOCK, add_to_blocks, block_sums, in_block
from service.store.database import Database, unbounded
from service.store.rows import CalibrationKey
from service.store.schema import label_bins, labels, pending_labels, predictions, scope


def purge(db: Database, older_than: float) -> int:
    """Delete predictions (and their labels) created before ``older_than``; returns the count."""

    def work(c):
        unbounded(c)
        old = sa.select(predictions.c.id).where(predictions.c.created_at < older_than)
        touched = c.execute(
            sa.select(labels.c.model, labels.c.version, labels.c.calibration_version, BLOCK)
            .where(labels.c.prediction_id.in_(old))
            .distinct()
        ).all()
        c.execute(labels.delete().where(labels.c.prediction_id.in_(old)))
        for model, version, calibration_version, block in touched:
            key = CalibrationKey(model, version, calibration_version)
            c.execute(label_bins.delete().where(*scope(label_bins, key), label_bins.c.block == block))
            add_to_blocks(c, block_sums(*scope(labels, key), in_block(block)))
        c.execute(pending_labels.delete().where(pending_labels.c.received_at < older_than))
        return c.execute(predictions.delete().where(predictions.c.created_at < older_than)).rowcount

    return db.run(work)
