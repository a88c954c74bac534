"""A store as version 2 of the schema left it: the wide prediction log and labels bound to it by a foreign key."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from service.store import legacy
from service.store.pending import PENDING, PendingLabel
from service.store.rows import LabelRow, PredictionRow


def version_2_store(
    url: str, predictions: Sequence[PredictionRow], labels: Sequence[LabelRow], pending: Sequence[PendingLabel] = ()
) -> None:
    """Add ``predictions``, ``labels`` and ``pending`` labels to the version-2 store at ``url`` (made first when the
    database is empty)."""
    engine = sa.create_engine(url)
    with engine.begin() as c:
        if not sa.inspect(c).has_table("schema_info"):
            legacy.create_version_2(c)
        insert_version_2(c, predictions)
        legacy.insert_version_2_labels(c, list(labels))
        if pending:
            c.execute(legacy.pending_labels.insert(), [p._asdict() | {"status": PENDING} for p in pending])
    engine.dispose()


def insert_version_2(c: sa.Connection, rows: Sequence[PredictionRow]) -> None:
    """Log ``rows`` as version 2 did."""
    if rows:
        c.execute(legacy.predictions.insert(), [dict(zip(legacy.FIELDS, r)) for r in rows])
