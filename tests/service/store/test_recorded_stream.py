"""The compact log answers GET /calibration as schema version 2 did, on a stream recorded with version 2's code
(``recorded_stream.py``, ``recorded/``): 600 digits served, 480 labels sent late, shuffled and in batches.

- The recorded store itself, upgraded: migrated, its log moved by the upkeep, then served by today's code.
- The same stream written through today's write path (logits left out where the temperature gives them back),
  the labels sent again through /feedback in their recorded batches.

Counts, decisions, sets and versions must be equal; every figure equal to 1e-9 relative (the same float32 rows
read the same way), but those the labels' logits feed (the refit, ``recalibration``), which come back from the
probabilities and the temperature: 1e-5. Times are not compared (they are when each run happened)."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from calibkit.manifest import load_manifest
from service.store import Store, legacy
from tests.service.conftest import DEFAULT_ARTIFACT, running_server
from tests.service.store.recorded_stream import MODEL, calibration, evaluate, send_labels, settings

RECORDED = Path(__file__).parent / "recorded"
TIMESTAMP = 1e9  # a float this large is a time (seconds since the epoch), which differs from run to run


def _recorded_store(tmp_path: Path) -> Path:
    path = tmp_path / "recorded.db"
    with gzip.open(RECORDED / "store.db.gz") as packed, path.open("wb") as out:
        shutil.copyfileobj(packed, out)
    return path


def _differences(new, old, path: str = "", loose: tuple[str, ...] = ()) -> list[str]:
    """Where ``new`` differs from ``old``: the path and both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}: keys {sorted(set(new) ^ set(old))}"] if set(new) != set(old) else []
        for k in sorted(set(new) & set(old)):
            out += _differences(new[k], old[k], f"{path}.{k}", loose)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(new)} items, recorded {len(old)}"]
        return [d for i, (a, b) in enumerate(zip(new, old)) for d in _differences(a, b, f"{path}[{i}]", loose)]
    if isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        if abs(old) > TIMESTAMP:
            return []
        rel = 1e-5 if any(part in path for part in loose) else 1e-9
        return [] if math.isclose(new, old, rel_tol=rel, abs_tol=1e-12) else [f"{path}: {new!r}, recorded {old!r}"]
    return [] if new == old else [f"{path}: {new!r}, recorded {old!r}"]


def _answer_of(url: str, tmp_path: Path, labels: list[list[dict]] | None = None) -> dict:
    """GET /calibration of a service over ``url`` after an evaluation pass, the labels ``labels`` sent (and a pass
    before them, as recorded) when given."""
    artifacts = tmp_path / "artifacts"
    if not artifacts.exists():  # the committed version alone, as recorded (``make run`` adds versions to artifacts/)
        shutil.copytree(DEFAULT_ARTIFACT, artifacts / MODEL / "1")
    with running_server(settings(artifacts, url)) as (base, app):
        evaluate(app)
        if labels is not None:
            send_labels(base, labels)
            evaluate(app)
        return calibration(base)


def test_the_recorded_store_upgraded_answers_as_recorded(tmp_path):
    url = f"sqlite:///{_recorded_store(tmp_path)}"
    store = Store(url)
    store.db.migrate()
    done = store.upkeep(retention_seconds=3650 * 86400.0)
    assert done is not None and done.converted == len(json.loads((RECORDED / "stream.json").read_text())["ids"])
    with store.db.engine.connect() as c:
        assert not legacy.present(c)
    store.db.engine.dispose()
    recorded = json.loads((RECORDED / "calibration.json").read_text())
    assert _differences(_answer_of(url, tmp_path), recorded) == []


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def fresh_url(request, tmp_path, postgres) -> str:
    return f"sqlite:///{tmp_path / 'fresh.db'}" if request.param == "sqlite" else postgres()


def test_the_stream_through_the_compact_log_answers_as_recorded(tmp_path, fresh_url):
    engine = sa.create_engine(f"sqlite:///{_recorded_store(tmp_path)}")
    with engine.connect() as c:
        stream = json.loads((RECORDED / "stream.json").read_text())
        served = legacy.fetch(c, stream["ids"])
    engine.dispose()
    temperature = load_manifest(DEFAULT_ARTIFACT / "manifest.json").calibration.temperature
    store = Store(fresh_url)
    store.predictions.insert([served[i]._replace(temperature=temperature) for i in stream["ids"]])
    with store.db.engine.connect() as c:  # the default model's rows keep no logits: the temperature gives them back
        assert c.exec_driver_sql("SELECT count(logits) FROM prediction_log").scalar_one() == 0
    store.db.engine.dispose()
    recorded = json.loads((RECORDED / "calibration.json").read_text())
    answer = _answer_of(fresh_url, tmp_path, stream["label_batches"])
    assert _differences(answer, recorded, loose=("recalibration",)) == []
