"""Labels and the windows read from them, a ``calibkit.stats.BinStats`` from block sums and totals."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import sqlalchemy as sa

from calibkit.stats import BinStats
from service.store import locks
from service.store.blocks import IDS, ROW_COLUMNS, bin_totals, in_block, labels_to_blocks, row_totals
from service.store.bulk import BulkInsert
from service.store.database import Database
from service.store.pending import PendingLabel, add_pending, pending_among
from service.store.predictions import Predictions
from service.store.rows import ANONYMOUS, CalibrationKey, LabelRow, NewestRows, PredictionRow, decode_rows
from service.store.schema import from_sources, label_bins, labels, scope

_insert_labels = BulkInsert(labels, [f.name for f in fields(LabelRow)])
_LABELLED_AMONG = sa.select(labels.c.prediction_id).where(labels.c.prediction_id.in_(IDS))


def insert_labels(c: sa.Connection, rows: Sequence[LabelRow]) -> set[str]:
    """Insert label rows and their block sums, but for ids already labelled (returned); writers take turns under
    ``locks.LABELS``, as alarms fold labels in sequence order."""
    if not rows:
        return set()
    locks.advisory_lock(c, locks.LABELS)
    existing = {r[0] for r in c.execute(_LABELLED_AMONG, {"ids": [r.prediction_id for r in rows]})}
    fresh = [r for r in rows if r.prediction_id not in existing]
    if fresh:
        _insert_labels(c, [tuple(vars(r).values()) for r in fresh])
        c.execute(labels_to_blocks(c.dialect.name), {"ids": [r.prediction_id for r in fresh]})
    return existing


@dataclass
class WindowSums:
    """A label window: its bin statistics, first and last label time and last label sequence number."""

    stats: BinStats
    first_labelled_at: float | None = None
    last_labelled_at: float | None = None
    last_seq: int = 0

    @property
    def n(self) -> int:
        return self.stats.n

    def add(self, totals) -> None:
        """Add per-bin totals rows (``bin_totals`` or ``row_totals``)."""
        totals = [tuple(t) for t in totals]
        if not totals:
            return
        bins = [t[0] for t in totals]
        count, confidence, correct, nll, brier = np.array([[float(v) for v in t[1:6]] for t in totals]).T  # Decimal
        self.stats.add_bins(bins, count, confidence, correct, nll.sum(), brier.sum())
        first, last = min(t[6] for t in totals), max(t[7] for t in totals)
        self.first_labelled_at = first if self.first_labelled_at is None else min(self.first_labelled_at, first)
        self.last_labelled_at = last if self.last_labelled_at is None else max(self.last_labelled_at, last)
        self.last_seq = max(self.last_seq, max(int(t[8]) for t in totals))


class Labels:
    def __init__(self, db: Database, predictions: Predictions):
        self.db = db
        self.predictions = predictions

    def insert(
        self,
        rows: Sequence[LabelRow],
        new_predictions: Sequence[PredictionRow] = (),
        pending: Sequence[PendingLabel] = (),
    ) -> tuple[set[str], set[str]]:
        """Insert labels (and offline predictions) and pending labels in one committed transaction; the prediction
        ids refused as duplicates (those that had a label, those that had a pending one): the first label wins."""
        compact = self.predictions.compact(new_predictions) if new_predictions else []

        def work(c):
            if compact:
                Predictions.write(c, compact)
            waiting = pending_among(c, [r.prediction_id for r in rows] + [p.prediction_id for p in pending])
            labelled = insert_labels(c, [r for r in rows if r.prediction_id not in waiting])
            add_pending(c, [p for p in pending if p.prediction_id not in waiting])
            return labelled, waiting

        return self.db.run(work) if rows or pending else (set(), set())

    def window(
        self,
        key: CalibrationKey,
        n_bins: int,
        *,
        last: int | None = None,
        seconds: float | None = None,
        now: float | None = None,
    ) -> WindowSums:
        """Sums of the last ``last`` labels, or of the last ``seconds`` (all when neither is given): whole blocks from
        ``label_bins`` plus the labels of the boundary blocks."""
        if last is not None and seconds is not None:
            raise ValueError("a window is a label count or a duration, not both")
        key_blocks, key_labels = scope(label_bins, key), scope(labels, key)

        def by_time(c, window: WindowSums, seconds: float) -> None:
            cutoff = (now or time.time()) - seconds
            spans = sa.select(label_bins.c.block).where(*key_blocks).group_by(label_bins.c.block)
            inside = spans.having(sa.func.min(label_bins.c.first_at) >= cutoff)
            straddling = [
                b
                for (b,) in c.execute(
                    spans.having(
                        sa.func.min(label_bins.c.first_at) < cutoff, sa.func.max(label_bins.c.last_at) >= cutoff
                    )
                )
            ]
            window.add(c.execute(bin_totals(*key_blocks, label_bins.c.block.in_(inside))))
            if straddling:
                rows = sa.select(*ROW_COLUMNS).where(
                    *key_labels, labels.c.labelled_at >= cutoff, sa.or_(*(in_block(b) for b in straddling))
                )
                window.add(c.execute(row_totals(rows.subquery())))

        def by_count(c, window: WindowSums) -> None:
            boundary = None
            if last is not None:
                counts = (
                    sa.select(label_bins.c.block, sa.func.sum(label_bins.c.count))
                    .where(*key_blocks)
                    .group_by(label_bins.c.block)
                    .order_by(label_bins.c.block.desc())
                )
                total = 0
                for block, n in c.execute(counts):
                    if total + n > last:
                        boundary = (block, last - total)
                        break
                    total += n
            newer = [label_bins.c.block > boundary[0]] if boundary else []
            window.add(c.execute(bin_totals(*key_blocks, *newer)))
            if boundary and boundary[1] > 0:
                rows = (
                    sa.select(*ROW_COLUMNS)
                    .where(*key_labels, in_block(boundary[0]))
                    .order_by(labels.c.seq.desc())
                    .limit(boundary[1])
                )
                window.add(c.execute(row_totals(rows.subquery())))

        def work(c):
            window = WindowSums(BinStats.empty(None, n_bins))
            if seconds is not None:
                by_time(c, window, seconds)
            else:
                by_count(c, window)
            return window

        return self.db.run(work, write=False)

    def newest(
        self,
        key: CalibrationKey,
        limit: int,
        *,
        after_seq: int = 0,
        count_from: int | None = None,
        seconds: float | None = None,
        now: float | None = None,
        sources: frozenset[str] | None = None,
    ) -> tuple[NewestRows, int | None]:
        """At most ``limit`` labelled rows with ``seq > after_seq``, newest first, and how many ``>= count_from``."""
        where = scope(labels, key) + from_sources(labels, sources)
        if seconds is not None:
            where.append(labels.c.labelled_at >= (now or time.time()) - seconds)
        query = (
            sa.select(labels.c.seq, labels.c.label, labels.c.probabilities, labels.c.logits)
            .where(*where, labels.c.seq > after_seq)
            .order_by(labels.c.seq.desc())
            .limit(limit)
        )
        counted = (
            None
            if count_from is None
            else sa.select(sa.func.count()).select_from(labels).where(*where, labels.c.seq >= count_from)
        )

        def work(c):
            rows = c.execute(query).all()
            count = None if counted is None else c.execute(counted).scalar_one()
            if not rows:
                return NewestRows.empty(), count
            probs = decode_rows([r.probabilities for r in rows])
            logits = np.full_like(probs, np.nan)
            present = [i for i, r in enumerate(rows) if r.logits is not None]
            if present:
                logits[present] = decode_rows([rows[i].logits for i in present])
            return NewestRows(
                np.array([r.seq for r in rows], dtype=np.int64),
                np.array([r.label for r in rows], dtype=np.int64),
                probs,
                logits,
            ), count

        return self.db.run(work, write=False)

    def by_source(
        self,
        key: CalibrationKey,
        n_bins: int,
        *,
        last: int | None = None,
        seconds: float | None = None,
        now: float | None = None,
    ) -> dict[str, BinStats]:
        """The bin statistics of a window per source: an aggregate over its label rows (its cost grows with it)."""
        source_of = sa.func.coalesce(labels.c.source, ANONYMOUS).label("source")
        rows = sa.select(*ROW_COLUMNS, source_of).where(*scope(labels, key))
        if seconds is not None:
            rows = rows.where(labels.c.labelled_at >= (now or time.time()) - seconds)
        elif last is not None:
            rows = rows.order_by(labels.c.seq.desc()).limit(last)
        r = rows.subquery()
        query = row_totals(r, r.c.source).order_by(r.c.source, r.c.conf_bin)

        def work(c) -> dict[str, BinStats]:
            found: dict[str, list] = {}
            for source, *totals in c.execute(query):
                found.setdefault(source, []).append(totals)
            out = {}
            for source, totals in found.items():
                window = WindowSums(BinStats.empty(None, n_bins))
                window.add(totals)
                out[source] = window.stats
            return out

        return self.db.run(work, write=False)

    def recent(self, key: CalibrationKey, limit: int) -> Sequence[sa.Row]:
        """(seq, labelled_at, conf_bin, confidence, correct) of the most recent labels, oldest first."""
        query = (
            sa.select(labels.c.seq, labels.c.labelled_at, labels.c.conf_bin, labels.c.confidence, labels.c.correct)
            .where(*scope(labels, key))
            .order_by(labels.c.seq.desc())
            .limit(limit)
        )
        return self.db.run(lambda c: c.execute(query).all()[::-1], write=False)

    def progress(self, key: CalibrationKey, folded_seq: int) -> tuple[int, int, float | None]:
        """(labels stored for ``key``, those after ``folded_seq``, when label ``folded_seq`` was stored): how far an
        alarm that folded up to ``folded_seq`` lags the store."""
        stored = sa.select(sa.func.coalesce(sa.func.sum(label_bins.c.count), 0)).where(*scope(label_bins, key))
        pending = sa.select(sa.func.count()).select_from(labels).where(*scope(labels, key), labels.c.seq > folded_seq)
        folded_at = sa.select(labels.c.labelled_at).where(labels.c.seq == folded_seq)

        def work(c):
            return (
                int(c.execute(stored).scalar_one()),
                int(c.execute(pending).scalar_one()),
                c.execute(folded_at).scalar_one_or_none(),
            )

        return self.db.run(work, write=False)

    def after(
        self, key: CalibrationKey, seq: int, connection: sa.Connection | None = None, newest: int | None = None
    ) -> Sequence[sa.Row]:
        """(seq, correct, confidence, source) of the labels after ``seq`` (only the ``newest`` most recent of
        them if given), in label order."""
        query = sa.select(
            labels.c.seq,
            labels.c.correct,
            labels.c.confidence,
            sa.func.coalesce(labels.c.source, ANONYMOUS).label("source"),
        ).where(*scope(labels, key), labels.c.seq > seq)
        query = query.order_by(labels.c.seq) if newest is None else query.order_by(labels.c.seq.desc()).limit(newest)

        def run(c: sa.Connection) -> Sequence[sa.Row]:
            rows = c.execute(query).all()
            return rows if newest is None else rows[::-1]

        return run(connection) if connection is not None else self.db.run(run, write=False)
