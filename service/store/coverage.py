"""The coverage of served prediction sets: the labels with a set, and a state row per model version (its adaptive
thresholds and coverage alarms by set choice), shared by all replicas."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from service.store.database import Database
from service.store.locks import LockedRow
from service.store.schema import coverage_state, from_sources, labels, of_version


def _with_sets(model: str, version: str, *columns: str) -> sa.Select:
    """``columns`` of the version's labels whose prediction had a set."""
    return sa.select(*(labels.c[name] for name in columns)).where(
        *of_version(labels, model, version), labels.c.covered.is_not(None)
    )


class CoverageStates:
    def __init__(self, db: Database):
        self.db = db

    @contextmanager
    def locked(self, model: str, version: str) -> Iterator[LockedRow]:
        """A unit of work holding the version's row write-locked (created empty on first use)."""
        initial = dict(model=model, version=version, last_seq=0, states="{}")
        with self.db.unit() as c:
            yield LockedRow(c, coverage_state, of_version(coverage_state, model, version), initial)

    def all(self) -> Sequence[sa.Row]:
        return self.db.run(lambda c: c.execute(sa.select(coverage_state)).all(), write=False)

    def get(self, model: str, version: str) -> sa.Row | None:
        """The version's state row (None before its first assessment)."""
        query = sa.select(coverage_state).where(*of_version(coverage_state, model, version))
        return self.db.run(lambda c: c.execute(query).first(), write=False)

    def labels_after(
        self, model: str, version: str, seq: int, connection: sa.Connection, sources: frozenset[str] | None = None
    ) -> Sequence[sa.Row]:
        """The version's labels with a set after ``seq``, in order (only those of ``sources`` when given)."""
        columns = ("seq", "covered", "set_method", "set_coverage", "set_randomized", "set_score")
        query = _with_sets(model, version, *columns).where(labels.c.seq > seq, *from_sources(labels, sources))
        return connection.execute(query.order_by(labels.c.seq)).all()

    def last_seq(self, model: str, version: str) -> int:
        """The newest label sequence number of the version (0 without labels)."""
        query = sa.select(sa.func.max(labels.c.seq)).where(*of_version(labels, model, version))
        return self.db.run(lambda c: c.execute(query).scalar() or 0, write=False)

    def window(
        self, model: str, version: str, last: int | None = None, seconds: float | None = None
    ) -> Sequence[sa.Row]:
        """The version's newest ``last`` labels with a set, or those of the last ``seconds`` (all without either)."""
        columns = ("set_method", "set_coverage", "set_randomized", "label", "set_size", "covered")
        query = _with_sets(model, version, *columns)
        if seconds is not None:
            query = query.where(labels.c.labelled_at >= time.time() - seconds)
        if last is not None:  # a count past any store's labels is every label (and past SQL's integers)
            query = query.order_by(labels.c.seq.desc()).limit(min(last, 2**62))
        return self.db.run(lambda c: c.execute(query).all(), write=False)
