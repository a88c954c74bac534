"""The alarm state in the store: the decision is a function of the label sequence (evaluation cadence,
restarts and replicas do not change it), and a store written by an older service keeps its data and
gets a working detector -- on SQLite and on the real PostgreSQL."""

import json
from types import SimpleNamespace
from unittest.mock import patch

import numpy as np
import pytest
import sqlalchemy as sa

from calibkit import binning
from calibkit.alarms import AlarmPolicy
from calibkit.detector import STATE_FORMAT
from calibkit.synthetic import Miscalibration, TrafficShape, draw
from service.metrics import ServiceMetrics
from service.monitoring import Monitor, alarm
from service.store import Store
from service.store.rows import LabelRow, PredictionRow
from service.store.schema import labels, monitor_state

EDGES = binning.equal_width_edges(15)
# calibrated labels, then over-confidence (population ECE 0.22): the alarm is raised within a few hundred
CONFIDENCE, CORRECT = draw(
    TrafficShape("cifar-like", 10, 2.5),
    Miscalibration("x2.5", logit_scale=2.5),
    streams=1,
    before=400,
    during=800,
    seed=3,
)
# the state of the Shiryaev-Roberts detector, of the per-label CUSUM detector of format 2, and of format 5 (the learned
# and logit-scale detectors without the gaps and steps, at A = 10^4)
OLD_DETECTORS = [
    json.dumps({"bets": [0.05, 0.1], "center": 0.0165, "tolerance": 0.01, "values": [3.0] * 4, "n": 900}),
    json.dumps(
        {
            "format": 2,
            "tolerance": 0.01,
            "threshold": 1e6,
            "gap_sum": [0.0] * 57,
            "log_statistic": [12.0, 3.0, 1.0],
            "alarmed": [False],
            "n": [900],
        }
    ),
    json.dumps(
        {
            "format": 5,
            "tolerance": 0.01,
            "threshold": 1e4,
            "block": 16,
            "gaps": [],
            "scales": [0.35, 0.5, 0.6, 0.7, 0.8, 0.87, 1.15, 1.25, 1.4, 1.6, 2.0, 2.5, 3.5],
            "fixed_weight": 0.5,
            "log_statistic": [3.0] * 17,
            "alarmed": [False],
            "n": [900],
        }
    ),
]


class _Repository:
    def get(self, name, version):
        manifest = SimpleNamespace(
            calibration=SimpleNamespace(temperature=1.0),
            reference=SimpleNamespace(confidences=list(np.linspace(0.2, 1.0, 50))),
            class_names=["a", "b"],
            label_shift=None,
        )
        return SimpleNamespace(name=name, version=version, manifest=manifest)


def _store(storage: Store, model: str, start: int, stop: int) -> None:
    conf, correct = CONFIDENCE[0, start:stop], CORRECT[0, start:stop]
    ids = [f"{model.encode().hex()[:5]:>05}{i:027x}" for i in range(start, stop)]  # prediction ids: 32 hex digits
    blobs = [np.array([c, 1 - c], np.float32).tobytes() for c in conf]
    storage.labels.insert(
        [
            LabelRow(
                i,
                model,
                "1",
                0,
                0,
                int(y),
                float(c),
                int(binning.bin_index(np.array([c]), EDGES)[0]),
                0.1,
                0.1,
                1000.0,
                b,
            )
            for i, c, y, b in zip(ids, conf, correct, blobs)
        ],
        [
            PredictionRow(i, model, "1", 0, 1000.0, 0, float(c), None, b, None, "offline")
            for i, c, b in zip(ids, conf, blobs)
        ],
    )


def _monitor(storage: Store) -> Monitor:
    return Monitor(
        storage,
        _Repository(),
        ServiceMetrics(),
        n_bins=15,
        policy=AlarmPolicy(),
        alarm_window="500",
        detail_rows=300,
        drift_rows=100,
        n_resamples=10,
    )


def _saved(storage: Store, model: str):
    with storage.db.engine.connect() as c:
        return c.execute(sa.select(monitor_state).where(monitor_state.c.model == model)).one()


def test_the_decision_depends_on_the_labels_not_on_when_or_where_they_are_evaluated(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    often = _monitor(storage)
    for start in range(0, 1200, 50):  # evaluated every 50 labels by one process
        _store(storage, "a", start, start + 50)
        often.assess("a", "1")
    _store(storage, "b", 0, 700)
    _monitor(storage).assess("b", "1")  # evaluated by a process that is then restarted ...
    _store(storage, "b", 700, 1200)
    status, _ = _monitor(storage).assess("b", "1")  # ... and by another replica, once
    a, b = _saved(storage, "a"), _saved(storage, "b")
    assert a.state == b.state == status.state == "alarm"
    detector_a, detector_b = json.loads(a.detector), json.loads(b.detector)
    assert detector_a["n"] == detector_b["n"] == 1200
    # the same state: the same decisions, the statistics and sums to rounding (the e-process folds a run of labels by
    # cumulative sums, whose rounding depends on where the run starts)
    assert detector_a.keys() == detector_b.keys()
    for name, value in detector_a.items():
        if isinstance(value, list) and value and isinstance(value[0], float):
            np.testing.assert_allclose(detector_b[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
        else:
            assert detector_b[name] == value, name
    storage.db.engine.dispose()


def test_a_store_filled_before_any_evaluation_is_not_read_whole(database_url):
    storage = Store(database_url)
    storage.db.migrate()
    _store(storage, "big", 0, 1100)
    with patch.object(alarm, "REPLAY_LABELS", 300):
        _monitor(storage).assess("big", "1")
    row = _saved(storage, "big")
    assert json.loads(row.detector)["n"] == 300 and row.last_seq == _saved_seq(storage)
    _store(storage, "big", 1100, 1200)
    _monitor(storage).assess("big", "1")  # from then on every new label is folded
    assert json.loads(_saved(storage, "big").detector)["n"] == 400
    storage.db.engine.dispose()


@pytest.mark.parametrize("old_detector", OLD_DETECTORS, ids=["shiryaev-roberts", "format-2", "format-5"])
def test_a_store_written_by_a_previous_detector_keeps_its_data_and_gets_a_working_detector(database_url, old_detector):
    storage = Store(database_url)
    storage.db.migrate()
    _store(storage, "old", 0, 1200)
    last_seq = _saved_seq(storage)
    with storage.db.engine.begin() as c:  # the monitor row as the Shiryaev-Roberts service left it
        c.execute(
            monitor_state.insert().values(
                model="old",
                version="1",
                calibration_version=0,
                last_seq=last_seq,
                detector=old_detector,
                state="warning",
                since=5.0,
                reasons='["e-detector not yet"]',
                updated_at=5.0,
            )
        )
    status, _ = _monitor(storage).assess("old", "1")
    row = _saved(storage, "old")
    detector = json.loads(row.detector)
    assert detector["format"] == STATE_FORMAT and detector["n"] == 1200  # the recent labels were replayed
    assert status.state == row.state == "alarm" and row.last_seq == last_seq
    with storage.db.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(labels)).scalar_one() == 1200
    storage.db.engine.dispose()


def _saved_seq(storage: Store) -> int:
    with storage.db.engine.connect() as c:
        return c.execute(sa.select(sa.func.max(labels.c.seq))).scalar_one()
