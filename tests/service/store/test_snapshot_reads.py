"""A read unit sees one snapshot on SQLite and on the real PostgreSQL: a reply built from several reads (counts and
the items they count, a window and its totals) never mixes states from before and after another replica's commit."""

import sqlalchemy as sa

from service.store import Store
from service.store.rows import LabelRow, PredictionRow
from service.store.schema import labels


def test_the_reads_of_one_unit_agree_while_another_replica_commits_between_them(database_url):
    reader, writer = Store(database_url), Store(database_url)
    reader.db.migrate()
    ids = [f"{i:032x}" for i in range(5)]
    label_rows = [LabelRow(i, "m", "1", 0, 1, 1, 0.9, 13, 0.1, 0.01, 2000.0) for i in ids]
    prediction_rows = [PredictionRow(i, "m", "1", 0, 2000.0, 1, 0.9, None, b"\0" * 12, None) for i in ids]
    count = sa.select(sa.func.count()).select_from(labels)

    def work(c: sa.Connection) -> tuple[int, int]:
        before = c.execute(count).scalar_one()
        writer.labels.insert(label_rows, prediction_rows)  # committed by another engine, as another replica would
        return before, c.execute(count).scalar_one()

    assert reader.db.run(work, write=False) == (0, 0)
    assert reader.db.run(lambda c: c.execute(count).scalar_one(), write=False) == 5
    if reader.db.engine.dialect.name == "postgresql":  # the pooled connection writes at the default level again
        assert reader.db.run(lambda c: c.exec_driver_sql("SHOW transaction_isolation").scalar()) == "read committed"
    reader.db.engine.dispose()
    writer.db.engine.dispose()
