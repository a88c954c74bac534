"""Persistence of predictions, labels, calibration versions and alarm state (SQLAlchemy Core).

SQLite file by default (WAL with synchronous=NORMAL: a committed label is in the write-ahead log
before the commit returns, so it survives a crash of the process; only a power loss can take the
last commits, which synchronous=FULL would prevent at the price of an fsync per commit), PostgreSQL by
URL when several replicas share one store. The schema is created and migrated at start. All
window statistics are aggregated in SQL (GROUP BY confidence bin) so no request scans every row.
Any database failure surfaces as ``StorageUnavailable`` (HTTP 503 + Retry-After) and the engine
reconnects by itself (pool_pre_ping) when the database is back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from calibkit.binning import BinSums
from service.errors import ServiceError

log = logging.getLogger("service.storage")

SCHEMA_VERSION = 1
BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")

metadata = sa.MetaData()

schema_info = sa.Table("schema_info", metadata, sa.Column("version", sa.Integer, primary_key=True))

predictions = sa.Table(
    "predictions", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Column("calibration_version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("predicted", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("uncalibrated_confidence", sa.Float),
    sa.Column("probabilities", sa.LargeBinary, nullable=False),
    sa.Column("logits", sa.LargeBinary),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Index("ix_predictions_model_time", "model", "version", "calibration_version", "created_at"),
)

labels = sa.Table(
    "labels", metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("prediction_id", sa.String(32), sa.ForeignKey("predictions.id", ondelete="CASCADE"), nullable=False,
              unique=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Column("calibration_version", sa.Integer, nullable=False),
    sa.Column("label", sa.Integer, nullable=False),
    sa.Column("correct", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("conf_bin", sa.Integer, nullable=False),
    sa.Column("nll", sa.Float, nullable=False),
    sa.Column("brier", sa.Float, nullable=False),
    sa.Column("labelled_at", sa.Float, nullable=False),
    sa.Index("ix_labels_window", "model", "version", "calibration_version", "seq"),
    sa.Index("ix_labels_time", "model", "version", "calibration_version", "labelled_at"),
)

calibrations = sa.Table(
    "calibrations", metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(32), primary_key=True),
    sa.Column("calibration_version", sa.Integer, primary_key=True),
    sa.Column("method", sa.String(32), nullable=False),
    sa.Column("temperature", sa.Float),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("details", sa.Text),
)

monitor_state = sa.Table(
    "monitor_state", metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(32), primary_key=True),
    sa.Column("calibration_version", sa.Integer, primary_key=True),
    sa.Column("last_seq", BigId, nullable=False),
    sa.Column("detector", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("since", sa.Float),
    sa.Column("reasons", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

alarm_events = sa.Table(
    "alarm_events", metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Column("calibration_version", sa.Integer, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("from_state", sa.String(16), nullable=False),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("reasons", sa.Text, nullable=False),
)


class StorageUnavailable(ServiceError):
    """The database cannot be reached: retry later."""

    status = 503
    code = "storage_unavailable"

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after)})


@dataclass(frozen=True)
class PredictionRow:
    id: str
    model: str
    version: str
    calibration_version: int
    created_at: float
    predicted: int
    confidence: float
    uncalibrated_confidence: float | None
    probabilities: bytes
    logits: bytes | None
    source: str = "online"


@dataclass(frozen=True)
class LabelRow:
    prediction_id: str
    model: str
    version: str
    calibration_version: int
    label: int
    correct: int
    confidence: float
    conf_bin: int
    nll: float
    brier: float
    labelled_at: float


@dataclass(frozen=True)
class WindowAggregate:
    """SQL-aggregated sums of a label window: bin sums plus totals of NLL and Brier."""

    sums: BinSums
    nll_sum: float
    brier_sum: float
    first_labelled_at: float | None
    last_labelled_at: float | None
    last_seq: int

    @property
    def n(self) -> int:
        return int(self.sums.count.sum())


def encode(values: np.ndarray) -> bytes:
    """float32 bytes of a vector (compact storage of probabilities and logits)."""
    return np.ascontiguousarray(values, dtype=np.float32).tobytes()


def decode(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.float32).astype(np.float64)


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, pool_pre_ping=True)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    connect_args = {"connect_timeout": 3} if url.startswith("postgresql") else {}
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5, pool_timeout=5,
                            connect_args=connect_args)


class Storage:
    """Every database operation of the service. Methods are blocking: call them from a thread."""

    def __init__(self, url: str, retry_after: int = 1):
        self.url = url
        self.retry_after = retry_after
        self.engine = _engine(url)
        self.schema_ready = False
        self.last_error: str | None = None

    def _fail(self, exc: Exception) -> StorageUnavailable:
        self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        log.warning("database unavailable: %s", self.last_error)
        return StorageUnavailable(f"the feedback store is unavailable ({self.last_error}); retry later", self.retry_after)

    def _run(self, work, write: bool = True):
        """Run ``work(connection)`` in a transaction, creating the schema first if needed."""
        try:
            if not self.schema_ready:
                self.migrate()
            with (self.engine.begin() if write else self.engine.connect()) as connection:
                result = work(connection)
            self.last_error = None
            return result
        except SQLAlchemyError as exc:  # OperationalError, DBAPIError and every other driver failure
            raise self._fail(exc) from exc

    def migrate(self) -> None:
        """Create the schema (idempotent) and record its version; refuse a newer schema."""
        with self.engine.begin() as connection:
            metadata.create_all(connection)
            found = connection.execute(sa.select(sa.func.max(schema_info.c.version))).scalar()
            if found is None:
                connection.execute(schema_info.insert().values(version=SCHEMA_VERSION))
            elif found > SCHEMA_VERSION:
                raise RuntimeError(f"database schema version {found} is newer than this service ({SCHEMA_VERSION})")
        self.schema_ready = True

    def ping(self) -> bool:
        try:
            with self.engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
            self.last_error = None
            return True
        except (OperationalError, DBAPIError) as exc:
            self._fail(exc)
            return False

    # predictions -----------------------------------------------------------------------------

    def insert_predictions(self, rows: Sequence[PredictionRow]) -> None:
        if rows:
            self._run(lambda c: c.execute(predictions.insert(), [r.__dict__ for r in rows]))

    def fetch_predictions(self, ids: Iterable[str]) -> dict[str, sa.Row]:
        ids = list(ids)

        def work(c):
            query = sa.select(predictions).where(predictions.c.id.in_(ids))
            return {row.id: row for row in c.execute(query)}

        return self._run(work, write=False) if ids else {}

    def recent_confidences(self, model: str, version: str, calibration_version: int, limit: int,
                           connection=None) -> np.ndarray:
        """Calibrated confidences of the most recent predictions (labelled or not)."""
        def work(c):
            query = (sa.select(predictions.c.confidence)
                     .where(predictions.c.model == model, predictions.c.version == version,
                            predictions.c.calibration_version == calibration_version)
                     .order_by(predictions.c.created_at.desc()).limit(limit))
            return np.array([r[0] for r in c.execute(query)], dtype=np.float64)

        return work(connection) if connection is not None else self._run(work, write=False)

    # labels ----------------------------------------------------------------------------------

    def insert_labels(self, rows: Sequence[LabelRow], new_predictions: Sequence[PredictionRow] = ()) -> set[str]:
        """Insert labels (and offline predictions) in one transaction; returns the prediction ids that
        already had a label (duplicates, not inserted). Committed before returning."""
        def work(c):
            if new_predictions:
                c.execute(predictions.insert(), [r.__dict__ for r in new_predictions])
            ids = [r.prediction_id for r in rows]
            existing = {r[0] for r in c.execute(sa.select(labels.c.prediction_id).where(labels.c.prediction_id.in_(ids)))}
            fresh = [r.__dict__ for r in rows if r.prediction_id not in existing]
            if fresh:
                c.execute(labels.insert(), fresh)
            return existing

        return self._run(work) if rows else set()

    def window(self, model: str, version: str, calibration_version: int, n_bins: int, *, last: int | None = None,
               seconds: float | None = None, now: float | None = None, connection=None) -> WindowAggregate:
        """Bin sums of the last ``last`` labels, or of the labels of the last ``seconds``."""
        scope = [labels.c.model == model, labels.c.version == version, labels.c.calibration_version == calibration_version]
        if seconds is not None:
            scope.append(labels.c.labelled_at >= (now or time.time()) - seconds)
        inner = sa.select(labels.c.seq, labels.c.conf_bin, labels.c.confidence, labels.c.correct, labels.c.nll,
                          labels.c.brier, labels.c.labelled_at).where(*scope)
        if last is not None:
            inner = inner.order_by(labels.c.seq.desc()).limit(last)
        inner = inner.subquery()
        query = (sa.select(inner.c.conf_bin, sa.func.count(), sa.func.sum(inner.c.confidence),
                           sa.func.sum(inner.c.correct), sa.func.sum(inner.c.nll), sa.func.sum(inner.c.brier),
                           sa.func.min(inner.c.labelled_at), sa.func.max(inner.c.labelled_at),
                           sa.func.max(inner.c.seq))
                 .group_by(inner.c.conf_bin))

        def work(c):
            count, conf, correct = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
            nll = brier = 0.0
            first, last_at, last_seq = [], [], 0
            for b, n, s_conf, s_correct, s_nll, s_brier, t0, t1, seq in c.execute(query):
                count[b], conf[b], correct[b] = n, s_conf, s_correct
                nll += s_nll
                brier += s_brier
                first.append(t0)
                last_at.append(t1)
                last_seq = max(last_seq, seq)
            return WindowAggregate(BinSums(count, conf, correct), nll, brier, min(first, default=None),
                                   max(last_at, default=None), last_seq)

        return work(connection) if connection is not None else self._run(work, write=False)

    def window_rows(self, model: str, version: str, calibration_version: int, limit: int, *,
                    seconds: float | None = None, now: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(labels, calibrated probabilities, raw logits or None) of the most recent labelled rows."""
        scope = [labels.c.model == model, labels.c.version == version, labels.c.calibration_version == calibration_version]
        if seconds is not None:
            scope.append(labels.c.labelled_at >= (now or time.time()) - seconds)
        query = (sa.select(labels.c.label, predictions.c.probabilities, predictions.c.logits)
                 .join(predictions, predictions.c.id == labels.c.prediction_id)
                 .where(*scope).order_by(labels.c.seq.desc()).limit(limit))

        def work(c):
            rows = c.execute(query).all()
            if not rows:
                return np.zeros(0, dtype=np.int64), np.zeros((0, 0)), None
            y = np.array([r[0] for r in rows], dtype=np.int64)
            probs = np.stack([decode(r[1]) for r in rows])
            logits = np.stack([decode(r[2]) for r in rows]) if all(r[2] is not None for r in rows) else None
            return y, probs, logits

        return self._run(work, write=False)

    def recent_labels(self, model: str, version: str, calibration_version: int, limit: int) -> list[sa.Row]:
        """(seq, labelled_at, conf_bin, confidence, correct) of the most recent labels, oldest first."""
        query = (sa.select(labels.c.seq, labels.c.labelled_at, labels.c.conf_bin, labels.c.confidence, labels.c.correct)
                 .where(labels.c.model == model, labels.c.version == version,
                        labels.c.calibration_version == calibration_version)
                 .order_by(labels.c.seq.desc()).limit(limit))
        return self._run(lambda c: c.execute(query).all()[::-1], write=False)

    def labels_after(self, connection, model: str, version: str, calibration_version: int, seq: int):
        query = (sa.select(labels.c.seq, labels.c.correct, labels.c.confidence)
                 .where(labels.c.model == model, labels.c.version == version,
                        labels.c.calibration_version == calibration_version, labels.c.seq > seq)
                 .order_by(labels.c.seq))
        return connection.execute(query).all()

    # calibration versions --------------------------------------------------------------------

    def calibrations_of(self, model: str, version: str) -> list[sa.Row]:
        query = (sa.select(calibrations).where(calibrations.c.model == model, calibrations.c.version == version)
                 .order_by(calibrations.c.calibration_version))
        return self._run(lambda c: c.execute(query).all(), write=False)

    def active_calibrations(self) -> list[sa.Row]:
        return self._run(lambda c: c.execute(sa.select(calibrations).where(calibrations.c.active)).all(), write=False)

    def ensure_manifest_calibration(self, model: str, version: str, method: str, temperature: float | None) -> None:
        """Record calibration version 0 (the one in the manifest) once, active unless another is."""
        def work(c):
            exists = c.execute(sa.select(calibrations.c.calibration_version).where(
                calibrations.c.model == model, calibrations.c.version == version,
                calibrations.c.calibration_version == 0)).first()
            if exists is None:
                any_active = c.execute(sa.select(calibrations.c.calibration_version).where(
                    calibrations.c.model == model, calibrations.c.version == version, calibrations.c.active)).first()
                c.execute(calibrations.insert().values(
                    model=model, version=version, calibration_version=0, method=method, temperature=temperature,
                    source="manifest", active=any_active is None, created_at=time.time(), details="{}"))

        self._run(work)

    def add_calibration(self, model: str, version: str, temperature: float, details: dict) -> int:
        """Record a refitted temperature as a new active calibration version; returns its number."""
        def work(c):
            latest = c.execute(sa.select(sa.func.max(calibrations.c.calibration_version)).where(
                calibrations.c.model == model, calibrations.c.version == version)).scalar() or 0
            c.execute(calibrations.update().where(calibrations.c.model == model, calibrations.c.version == version)
                      .values(active=False))
            c.execute(calibrations.insert().values(
                model=model, version=version, calibration_version=latest + 1, method="temperature",
                temperature=temperature, source="refit", active=True, created_at=time.time(),
                details=json.dumps(details)))
            return latest + 1

        return self._run(work)

    def activate_calibration(self, model: str, version: str, calibration_version: int) -> bool:
        def work(c):
            found = c.execute(sa.select(calibrations.c.calibration_version).where(
                calibrations.c.model == model, calibrations.c.version == version,
                calibrations.c.calibration_version == calibration_version)).first()
            if found is None:
                return False
            c.execute(calibrations.update().where(calibrations.c.model == model, calibrations.c.version == version)
                      .values(active=calibrations.c.calibration_version == calibration_version))
            return True

        return self._run(work)

    # alarm state -----------------------------------------------------------------------------

    def transaction(self, work):
        """Run ``work(connection)`` in one write transaction (used by the monitor's locked update)."""
        return self._run(work)

    def monitor_rows(self) -> list[sa.Row]:
        return self._run(lambda c: c.execute(sa.select(monitor_state)).all(), write=False)

    def monitor_row(self, model: str, version: str, calibration_version: int) -> sa.Row | None:
        query = sa.select(monitor_state).where(monitor_state.c.model == model, monitor_state.c.version == version,
                                               monitor_state.c.calibration_version == calibration_version)
        return self._run(lambda c: c.execute(query).first(), write=False)

    def alarm_history(self, model: str, version: str, limit: int = 50) -> list[sa.Row]:
        query = (sa.select(alarm_events).where(alarm_events.c.model == model, alarm_events.c.version == version)
                 .order_by(alarm_events.c.id.desc()).limit(limit))
        return self._run(lambda c: c.execute(query).all(), write=False)

    def purge(self, older_than: float) -> int:
        """Delete predictions (and their labels) created before ``older_than``; returns the count."""
        def work(c):
            old = sa.select(predictions.c.id).where(predictions.c.created_at < older_than)
            c.execute(labels.delete().where(labels.c.prediction_id.in_(old)))
            return c.execute(predictions.delete().where(predictions.c.created_at < older_than)).rowcount

        return self._run(work)
