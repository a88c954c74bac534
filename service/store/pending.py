"""Labels that arrived before their prediction was stored, kept as pending until they are joined to it (in order
of arrival, then leaving this table), expire after the horizon or are rejected at the join; none silently."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import sqlalchemy as sa

from service.store import locks
from service.store.blocks import IDS
from service.store.database import Database
from service.store.predictions import Predictions
from service.store.rows import ANONYMOUS, LabelRow, PredictionRow
from service.store.schema import pending_labels

PENDING, EXPIRED, REJECTED = "pending", "expired", "rejected"
ALREADY_LABELLED = "duplicate feedback: this prediction already has a label"
_PENDING_AMONG = sa.select(pending_labels.c.prediction_id).where(
    pending_labels.c.prediction_id.in_(IDS), pending_labels.c.status == PENDING
)
_ANY_PENDING = sa.select(pending_labels.c.seq).where(pending_labels.c.status == PENDING).limit(1)
_WAITING = (
    sa.select(pending_labels.c.seq, pending_labels.c.prediction_id, pending_labels.c.label, pending_labels.c.source)
    .where(pending_labels.c.status == PENDING, pending_labels.c.seq > sa.bindparam("after"))
    .order_by(pending_labels.c.seq)
)
_BY_STATUS = sa.select(pending_labels.c.status, sa.func.count()).group_by(pending_labels.c.status)


class Joinable(NamedTuple):
    """A pending label whose prediction is stored, with the prediction."""

    seq: int
    label: str
    source: str | None
    prediction: PredictionRow


Resolver = Callable[[list[Joinable]], tuple[dict[int, LabelRow], dict[int, str]]]


class PendingLabel(NamedTuple):
    """A label stored until its prediction arrives: the prediction id, the label as sent (JSON) and when."""

    prediction_id: str
    label: str
    received_at: float
    source: str = ANONYMOUS


@dataclass
class JoinPass:
    """What one pass of ``PendingLabels.join`` did: the label rows stored, the labels rejected, expired and waiting."""

    joined: list[LabelRow]
    rejected: int
    expired: int
    pending: int


def pending_among(c: sa.Connection, ids: Sequence[str]) -> set[str]:
    """The prediction ids among ``ids`` that have a pending label."""
    return {r[0] for r in c.execute(_PENDING_AMONG, {"ids": list(ids)})} if ids else set()


def add_pending(c: sa.Connection, rows: Sequence[PendingLabel]) -> None:
    if rows:
        c.execute(pending_labels.insert(), [r._asdict() | {"status": PENDING} for r in rows])


class PendingLabels:
    def __init__(self, db: Database, predictions: Predictions):
        self.db = db
        self.predictions = predictions

    def _joinable(self, c: sa.Connection, limit: int) -> list[Joinable]:
        """The oldest ``limit`` pending labels whose prediction is stored, read a page at a time."""
        found: list[Joinable] = []
        after = 0
        while len(found) < limit:
            page = c.execute(_WAITING.limit(limit), {"after": after}).all()
            if not page:
                break
            stored = self.predictions.fetch([r.prediction_id for r in page], c)
            found += [
                Joinable(r.seq, r.label, r.source, stored[r.prediction_id]) for r in page if r.prediction_id in stored
            ]
            after = page[-1].seq
        return found[:limit]

    def join(
        self,
        resolve: Resolver,
        insert: Callable[[sa.Connection, list[LabelRow]], set[str]],
        *,
        now: float,
        horizon: float,
        limit: int = 5000,
    ) -> JoinPass | None:
        """One pass in one transaction: at most ``limit`` joinable pending labels become label rows, those past
        ``horizon`` seconds expire; None while another replica runs a pass."""

        def work(c: sa.Connection) -> JoinPass | None:
            if c.execute(_ANY_PENDING).first() is None:  # the common case: a read, no lock, no write
                return JoinPass([], 0, 0, 0)
            if not locks.try_advisory_lock(c, locks.PENDING_LABELS):
                return None
            rows, first, reasons = self._joinable(c, limit), {}, {}
            for row in rows:  # two pending labels for one prediction (sent to two replicas at once): the first wins
                if row.prediction.id in first:
                    reasons[row.seq] = ALREADY_LABELLED
                else:
                    first[row.prediction.id] = row
            label_rows, refused = resolve(list(first.values()))
            reasons |= refused
            ordered = sorted(label_rows.items())
            labelled = insert(c, [r for _, r in ordered])
            joined = {seq: r for seq, r in ordered if r.prediction_id not in labelled}
            reasons |= {seq: ALREADY_LABELLED for seq, r in ordered if r.prediction_id in labelled}
            if joined:
                c.execute(pending_labels.delete().where(pending_labels.c.seq.in_(list(joined))))
            for seq, reason in reasons.items():
                c.execute(
                    pending_labels.update()
                    .where(pending_labels.c.seq == seq)
                    .values(status=REJECTED, reason=reason, resolved_at=now)
                )
            expired = c.execute(
                pending_labels.update()
                .where(pending_labels.c.status == PENDING, pending_labels.c.received_at < now - horizon)
                .values(status=EXPIRED, reason=f"no prediction with this id within {horizon:g} s", resolved_at=now)
            ).rowcount
            waiting = c.execute(
                sa.select(sa.func.count()).select_from(pending_labels).where(pending_labels.c.status == PENDING)
            ).scalar_one()
            return JoinPass(list(joined.values()), len(reasons), expired, int(waiting))

        return self.db.run(work)

    def unmatched(self, status: str | None, limit: int) -> dict:
        """Counts of the labels pending, expired and rejected, and the ``limit`` newest (of ``status``, if given)."""
        where = [pending_labels.c.status == status] if status else []
        listed = sa.select(pending_labels).where(*where).order_by(pending_labels.c.seq.desc()).limit(limit)

        return self.db.run(  # one snapshot: the counts and the items agree
            lambda c: _counts(c) | {"items": [r._asdict() for r in c.execute(listed)] if limit else []}, write=False
        )

    def counts(self) -> dict[str, int]:
        """Labels pending, expired and rejected at the join."""
        return self.db.run(_counts, write=False)


def _counts(c: sa.Connection) -> dict[str, int]:
    return {PENDING: 0, EXPIRED: 0, REJECTED: 0} | {s: int(n) for s, n in c.execute(_BY_STATUS)}
