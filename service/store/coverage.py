"""The coverage of served prediction sets: the labels that say whether a set held its label, and the state row per
model version (its adaptive thresholds and coverage alarms by set choice), shared by all replicas."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from service.store.database import Database
from service.store.locks import locked_row
from service.store.rows import ANONYMOUS
from service.store.schema import coverage_state, labels


class LockedCoverageState:
    """A model version's coverage row, write-locked until the unit of work ends."""

    def __init__(self, connection: sa.Connection, model: str, version: str, row: sa.Row):
        self.connection, self.model, self.version, self.row = connection, model, version, row

    def save(self, last_seq: int, states: str) -> None:
        self.connection.execute(
            coverage_state.update()
            .where(coverage_state.c.model == self.model, coverage_state.c.version == self.version)
            .values(last_seq=last_seq, states=states, updated_at=time.time())
        )


class CoverageStates:
    def __init__(self, db: Database):
        self.db = db

    @contextmanager
    def locked(self, model: str, version: str) -> Iterator[LockedCoverageState]:
        """A unit of work holding the version's row write-locked (created empty on first use), as
        ``AlarmStates.locked`` does; what is saved commits when the block ends."""
        where = (coverage_state.c.model == model, coverage_state.c.version == version)
        with self.db.unit() as c:
            row = locked_row(c, coverage_state, where, dict(model=model, version=version, last_seq=0, states="{}"))
            yield LockedCoverageState(c, model, version, row)

    def all(self) -> Sequence[sa.Row]:
        return self.db.run(lambda c: c.execute(sa.select(coverage_state)).all(), write=False)

    def get(self, model: str, version: str) -> sa.Row | None:
        """The version's state row (None before its first assessment)."""
        query = sa.select(coverage_state).where(coverage_state.c.model == model, coverage_state.c.version == version)
        return self.db.run(lambda c: c.execute(query).first(), write=False)

    def labels_after(
        self, model: str, version: str, seq: int, connection: sa.Connection, sources: frozenset[str] | None = None
    ) -> Sequence[sa.Row]:
        """(seq, covered, set_method, set_coverage, set_randomized, set_score) of the version's labels after ``seq``
        whose prediction had a set, in label order (only those of ``sources`` when given)."""
        query = (
            sa.select(
                labels.c.seq,
                labels.c.covered,
                labels.c.set_method,
                labels.c.set_coverage,
                labels.c.set_randomized,
                labels.c.set_score,
            )
            .where(
                labels.c.model == model,
                labels.c.version == version,
                labels.c.seq > seq,
                labels.c.covered.is_not(None),
            )
            .order_by(labels.c.seq)
        )
        if sources is not None:
            query = query.where(sa.func.coalesce(labels.c.source, ANONYMOUS).in_(sorted(sources)))
        return connection.execute(query).all()

    def last_seq(self, model: str, version: str) -> int:
        """The newest label sequence number of the version (0 without labels)."""
        query = sa.select(sa.func.max(labels.c.seq)).where(labels.c.model == model, labels.c.version == version)
        return self.db.run(lambda c: c.execute(query).scalar() or 0, write=False)

    def window(
        self, model: str, version: str, last: int | None = None, seconds: float | None = None
    ) -> Sequence[sa.Row]:
        """(set_method, set_coverage, set_randomized, label, set_size, covered) of the version's newest ``last``
        labels with a set, or of those of the last ``seconds`` (all of them when neither is given)."""
        query = sa.select(
            labels.c.set_method,
            labels.c.set_coverage,
            labels.c.set_randomized,
            labels.c.label,
            labels.c.set_size,
            labels.c.covered,
        ).where(labels.c.model == model, labels.c.version == version, labels.c.covered.is_not(None))
        if seconds is not None:
            query = query.where(labels.c.labelled_at >= time.time() - seconds)
        if last is not None:  # a count past any store's labels is every label (and past SQL's integers)
            query = query.order_by(labels.c.seq.desc()).limit(min(last, 2**62))
        return self.db.run(lambda c: c.execute(query).all(), write=False)
