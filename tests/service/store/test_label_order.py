"""Labels become visible in sequence order on the real PostgreSQL: the alarms fold the labels after the last
sequence number they folded, so a writer that drew higher numbers must not commit before one that drew lower
ones, or those would never be folded. Writers of one calibration's labels already queue on its block sums; the
coverage state folds a model version's labels across its calibrations, whose blocks differ."""

import threading

import pytest
import sqlalchemy as sa

from service.store import Store
from service.store.labels import insert_labels
from service.store.rows import LabelRow, PredictionRow
from service.store.schema import labels

pytestmark = pytest.mark.e2e


def rows(first: int, n: int, calibration: int) -> tuple[list[LabelRow], list[PredictionRow]]:
    ids = [f"{i:032x}" for i in range(first, first + n)]
    return (
        [LabelRow(i, "m", "1", calibration, 1, 1, 0.9, 13, 0.1, 0.01, 2000.0) for i in ids],
        [PredictionRow(i, "m", "1", calibration, 2000.0, 1, 0.9, None, b"\0" * 12, None) for i in ids],
    )


def test_a_second_replica_waits_until_the_first_commits_its_labels_of_another_calibration(pg_url):
    first, second = Store(pg_url), Store(pg_url)
    first.db.migrate()
    first_labels, first_predictions = rows(0, 5, calibration=0)
    second_labels, second_predictions = rows(100, 5, calibration=1)
    done = threading.Event()

    def other_replica():
        second.labels.insert(second_labels, second_predictions)
        done.set()

    compact = first.predictions.compact(first_predictions)
    with first.db.unit() as c:
        first.predictions.write(c, compact)
        insert_labels(c, first_labels)  # drew its sequence numbers; not committed yet
        writer = threading.Thread(target=other_replica)
        writer.start()
        assert not done.wait(1.0), "the second writer committed before the first, which drew lower numbers"
        seen = first.db.run(lambda r: r.execute(sa.select(sa.func.count()).select_from(labels)).scalar(), write=False)
        assert seen == 0
    writer.join(10)
    assert done.is_set()
    with first.db.engine.connect() as c:
        order = [r.prediction_id for r in c.execute(sa.select(labels.c.prediction_id).order_by(labels.c.seq))]
    assert order == [r.prediction_id for r in first_labels + second_labels]
    first.db.engine.dispose()
    second.db.engine.dispose()
