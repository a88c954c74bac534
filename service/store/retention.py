"""Retention and the prediction log's upkeep, one replica at a time: whole partitions on PostgreSQL, key ranges on
SQLite; no statement scans the log."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from service.store import legacy, partitions
from service.store.blocks import BLOCK, add_to_blocks, block_sums, in_block
from service.store.database import Database, unbounded
from service.store.predictions import Predictions
from service.store.rows import CalibrationKey, first_id
from service.store.schema import calibration_keys, label_bins, labels, pending_labels, prediction_log, scope

log = logging.getLogger("service.store")
CONVERT_BATCH = 5000


@dataclass
class Upkeep:
    """What one pass did; ``partitions_end``: when the newest partition ends (None on SQLite)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    deleted: int = 0
    labels: int = 0
    pending: int = 0
    converted: int = 0
    partitions_end: float | None = None


def upkeep(db: Database, predictions: Predictions, now: float, retention_seconds: float) -> Upkeep:
    """One pass under the maintenance turn: make partitions, expire old rows, move version-2 rows."""
    cutoff = now - retention_seconds
    done = Upkeep()
    postgres = db.engine.dialect.name == "postgresql"
    if postgres:  # the partitions from yesterday on (a write makes any other it needs), and the day of the cutoff on
        done.created = db.run(lambda c: partitions.make_ahead(c, now))
        expired = [p for p in db.run(partitions.existing, write=False) if p.end <= cutoff]
        kept_from = partitions.partition_of(cutoff).start
    else:
        expired, kept_from = [], cutoff
    done.labels, done.pending, done.deleted = db.run(lambda c: _expire_rows(c, first_id(kept_from), cutoff))
    for part in expired:
        partitions.detach_and_drop(db.engine, part)
        done.dropped.append(part.name)
    if postgres:
        for part in db.run(partitions.detached, write=False):  # detached by a pass that then failed to drop them
            if part.end <= cutoff:
                partitions.detach_and_drop(db.engine, part, attached=False)
                done.dropped.append(part.name)
    done.converted = convert(db, predictions, first_id(kept_from))
    if postgres:
        done.partitions_end = max((p.end for p in db.run(partitions.existing, write=False)), default=None)
    return done


def _expire_rows(c: sa.Connection, bound: str, cutoff: float) -> tuple[int, int, int]:
    """Delete the labels before the id ``bound`` (their blocks' sums rebuilt), the pending labels before ``cutoff``
    and, on SQLite, the log's rows before ``bound``: the rows deleted of each."""
    unbounded(c)
    old = labels.c.prediction_id < bound
    touched = c.execute(
        sa.select(labels.c.model, labels.c.version, labels.c.calibration_version, BLOCK).where(old).distinct()
    ).all()
    n_labels = c.execute(labels.delete().where(old)).rowcount
    for model, version, calibration_version, block in touched:
        key = CalibrationKey(model, version, calibration_version)
        c.execute(label_bins.delete().where(*scope(label_bins, key), label_bins.c.block == block))
        add_to_blocks(c, block_sums(*scope(labels, key), in_block(block)))
    n_pending = c.execute(pending_labels.delete().where(pending_labels.c.received_at < cutoff)).rowcount
    n_log = 0
    if c.dialect.name != "postgresql":
        for (key_id,) in c.execute(sa.select(calibration_keys.c.id)):
            n_log += c.execute(
                prediction_log.delete().where(prediction_log.c.key == key_id, prediction_log.c.id < bound)
            ).rowcount
    return n_labels, n_pending, n_log


def convert(db: Database, predictions: Predictions, bound: str, budget_seconds: float = 5.0) -> int:
    """Move the version-2 log's rows from the id ``bound`` on, newest first, a batch per transaction, for about
    ``budget_seconds``; drop it once none is that new. Rows moved."""
    moved, started = 0, time.monotonic()
    while time.monotonic() - started < budget_seconds:
        batch = db.run(lambda c: legacy.newest(c, bound, CONVERT_BATCH) if legacy.present(c) else None, write=False)
        if batch is None:
            break
        if not batch:
            db.run(legacy.drop)
            log.info("the version-2 prediction log is converted and dropped")
            break
        db.run(functools.partial(_move, predictions.compact(batch), [r.id for r in batch]))
        moved += len(batch)
    return moved


def _move(compact: list[tuple], ids: list[str], c: sa.Connection) -> None:
    """Write the converted rows and delete the version-2 rows they came from, in one transaction."""
    Predictions.write(c, compact)
    legacy.forget(c, ids)
