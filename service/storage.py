"""Persistence of predictions, labels, calibration versions and alarm state (SQLAlchemy Core).

SQLite file by default (WAL with synchronous=NORMAL: a committed label is in the write-ahead log
before the commit returns, so it survives a crash of the process; only a power loss can take the
last commits, which synchronous=FULL would prevent at the price of an fsync per commit), PostgreSQL by
URL when several replicas share one store. The schema is created and migrated at start.

Window statistics never scan all labels: every label is also added, in the transaction that stores
it, to the mergeable per-bin sums of its *block* (``label_bins``: one row per model version,
calibration version, block of ``BLOCK_LABELS`` consecutive label sequence numbers and confidence bin).
A window is the sum of the blocks it covers entirely plus an SQL aggregate of the labels of at most
a few boundary blocks, so its cost depends on the number of blocks, not on the number of labels.
Any database failure surfaces as ``StorageUnavailable`` (HTTP 503 + Retry-After) and the engine
reconnects by itself (pool_pre_ping) when the database is back.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from calibkit.alarms import OK
from calibkit.binning import BinSums
from service.errors import ServiceError

log = logging.getLogger("service.storage")

SCHEMA_VERSION = 2
BLOCK_LABELS = 4096
BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")

metadata = sa.MetaData()


def _calibration_key(primary_key: bool = False) -> list[sa.Column]:
    """The (model, version, calibration_version) columns every table is scoped by; part of the
    primary key for tables with one row per model version and calibration version."""
    return [sa.Column("model", sa.String(128), primary_key=primary_key, nullable=False),
            sa.Column("version", sa.String(32), primary_key=primary_key, nullable=False),
            sa.Column("calibration_version", sa.Integer, primary_key=primary_key, nullable=False)]


schema_info = sa.Table("schema_info", metadata, sa.Column("version", sa.Integer, primary_key=True))

predictions = sa.Table(
    "predictions", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    *_calibration_key(),
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
    *_calibration_key(),
    sa.Column("label", sa.Integer, nullable=False),
    sa.Column("correct", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("conf_bin", sa.Integer, nullable=False),
    sa.Column("nll", sa.Float, nullable=False),
    sa.Column("brier", sa.Float, nullable=False),
    sa.Column("labelled_at", sa.Float, nullable=False),
    sa.Column("probabilities", sa.LargeBinary),  # as served (copied from the prediction): detail metrics
    sa.Column("logits", sa.LargeBinary),  # read one index range of labels, never a join
    sa.Index("ix_labels_window", "model", "version", "calibration_version", "seq"),
    sa.Index("ix_labels_time", "model", "version", "calibration_version", "labelled_at"),
)

label_bins = sa.Table(
    "label_bins", metadata,
    *_calibration_key(primary_key=True),
    sa.Column("block", BigId, primary_key=True),
    sa.Column("conf_bin", sa.Integer, primary_key=True),
    sa.Column("count", BigId, nullable=False),
    sa.Column("confidence_sum", sa.Float, nullable=False),
    sa.Column("correct_sum", sa.Float, nullable=False),
    sa.Column("nll_sum", sa.Float, nullable=False),
    sa.Column("brier_sum", sa.Float, nullable=False),
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("last_at", sa.Float, nullable=False),
    sa.Column("last_seq", BigId, nullable=False),
)

calibrations = sa.Table(
    "calibrations", metadata,
    *_calibration_key(primary_key=True),
    sa.Column("method", sa.String(32), nullable=False),
    sa.Column("temperature", sa.Float),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("details", sa.Text),
)

monitor_state = sa.Table(
    "monitor_state", metadata,
    *_calibration_key(primary_key=True),
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
    *_calibration_key(),
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


class PredictionRow(NamedTuple):
    """One logged prediction, its fields in the column order of ``predictions`` (bulk inserts pass
    these tuples straight to the driver)."""

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


# SQLite inserts: full chunks of _SQLITE_CHUNK rows by one multi-row statement, the rest row by row. Two
# statement texts per table only: the driver caches prepared statements by text, and a text per batch
# length would fill that cache with statements of thousands of parameters (hundreds of MiB).
_SQLITE_CHUNK = 256
# binary COPY needs each column's exact wire type
_BINARY_TYPES = {sa.String: "text", sa.Integer: "int4", sa.Float: "float8", sa.LargeBinary: "bytea"}


class _BulkInsert:
    """Bulk insert of plain tuples (``columns`` of ``table``, in order) by the driver's fastest path:
    binary COPY on PostgreSQL (no text formatting in the driver nor parsing in the server: a quarter
    less CPU per row in all than text COPY); on SQLite, multi-row INSERT statements. SQLAlchemy's
    per-row bind processing costs 2-4x more, and an executemany steps SQLite once per row, handing the
    GIL back and forth with the event loop each time."""

    def __init__(self, table: sa.Table, columns: Sequence[str]):
        names, placeholders = ", ".join(columns), f"({', '.join('?' * len(columns))})"
        self.table, self.columns = table, list(columns)
        self.insert_row = f"INSERT INTO {table.name} ({names}) VALUES {placeholders}"
        self.insert_chunk = self.insert_row + ", " + ", ".join([placeholders] * (_SQLITE_CHUNK - 1))
        self.copy = f"COPY {table.name} ({names}) FROM STDIN (FORMAT BINARY)"
        self.copy_types = [_BINARY_TYPES[type(table.c[name].type)] for name in columns]

    def __call__(self, c: sa.Connection, rows: Sequence[tuple]) -> None:
        dialect = c.dialect.name
        if dialect == "postgresql" and c.dialect.driver == "psycopg":
            with c.connection.driver_connection.cursor() as cursor, cursor.copy(self.copy) as copy:
                copy.set_types(self.copy_types)
                for row in rows:
                    copy.write_row(row)
        elif dialect == "sqlite":
            full = len(rows) - len(rows) % _SQLITE_CHUNK
            for start in range(0, full, _SQLITE_CHUNK):
                c.exec_driver_sql(self.insert_chunk, tuple(v for row in rows[start:start + _SQLITE_CHUNK] for v in row))
            if full < len(rows):
                c.exec_driver_sql(self.insert_row, list(rows[full:]))
        else:
            c.execute(self.table.insert(), [dict(zip(self.columns, row)) for row in rows])


_insert_predictions = _BulkInsert(predictions, PredictionRow._fields)


class NewestRows(NamedTuple):
    """Labelled rows, newest first: sequence numbers, labels, calibrated probabilities as served and raw
    logits (NaN rows where none were stored)."""

    seq: np.ndarray
    y: np.ndarray
    probs: np.ndarray
    logits: np.ndarray

    @classmethod
    def empty(cls) -> NewestRows:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0)), np.zeros((0, 0)))

    def head(self, n: int) -> NewestRows:
        """The ``n`` newest rows."""
        return NewestRows(*(a[:n] for a in self))

    def then(self, older: NewestRows, limit: int) -> NewestRows:
        """These rows followed by ``older`` ones, at most ``limit`` in all."""
        if not len(self.seq):
            return older.head(limit)
        if not len(older.seq):
            return self.head(limit)
        return NewestRows(*(np.concatenate([a, b])[:limit] for a, b in zip(self, older)))


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
    probabilities: bytes | None = None
    logits: bytes | None = None


_insert_labels = _BulkInsert(labels, [f.name for f in fields(LabelRow)])


@dataclass(frozen=True)
class WindowAggregate:
    """Sums of a label window: bin sums plus totals of NLL and Brier, first and last label."""

    sums: BinSums
    nll_sum: float
    brier_sum: float
    first_labelled_at: float | None
    last_labelled_at: float | None
    last_seq: int

    @property
    def n(self) -> int:
        return int(self.sums.count.sum())


def prediction_ids(n: int) -> list[str]:
    """``n`` new prediction ids: 32 hex digits, a millisecond timestamp then 80 random bits, like
    UUIDv7 (RFC 9562). Time-ordered keys are inserted at the end of the primary-key and label
    indexes instead of at random pages, which keeps inserts fast in a store of millions of rows."""
    stamp = f"{time.time_ns() // 1_000_000:012x}"
    digits = os.urandom(10 * n).hex()
    return [stamp + digits[20 * i:20 * (i + 1)] for i in range(n)]


def encode_rows(matrix: np.ndarray) -> list[bytes]:
    """float32 bytes of every row of a (rows, k) array (compact storage of probabilities and logits)."""
    return [row.tobytes() for row in np.ascontiguousarray(matrix, dtype=np.float32)]


def decode_rows(blobs: list[bytes]) -> np.ndarray:
    """(rows, k) float64 from equal-length ``encode_rows`` blobs, in one conversion."""
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1).astype(np.float64)


def _engine(url: str, timeout: float) -> sa.Engine:
    """The engine; a query waits at most ``timeout`` seconds for a lock (SQLite's busy timeout, PostgreSQL's
    lock_timeout) and runs at most that long (PostgreSQL's statement_timeout), so a stuck store answers
    503 in bounded time; the pool hands out a connection within it or fails."""
    if url.startswith("sqlite"):
        # a small statement cache: IN lists of varying length are a new prepared statement each
        engine = sa.create_engine(url, connect_args={"timeout": timeout, "check_same_thread": False,
                                                     "cached_statements": 32}, pool_pre_ping=True)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    milliseconds = max(1, int(timeout * 1000))
    connect_args = {"connect_timeout": max(1, round(timeout)),
                    "options": f"-c statement_timeout={milliseconds} -c lock_timeout={milliseconds}"} \
        if url.startswith("postgresql") else {}
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5, pool_timeout=timeout,
                            connect_args=connect_args)


def _unbounded(connection: sa.Connection) -> None:
    """Lift the statement and lock timeouts for this transaction (migrations and retention may be long)."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SET LOCAL statement_timeout = 0"))
        connection.execute(sa.text("SET LOCAL lock_timeout = 0"))


class Storage:
    """Every database operation of the service. Methods are blocking: call them from a thread."""

    def __init__(self, url: str, retry_after: int = 1, timeout: float = 5.0):
        self.url = url
        self.retry_after = retry_after
        self.engine = _engine(url, timeout)
        self.schema_ready = False
        self.last_error: str | None = None

    def _fail(self, exc: Exception) -> StorageUnavailable:
        """The 503 for a failed operation. The driver's text (hosts, ports, database names) goes to the log,
        once per outage, and to ``last_error`` for authenticated views; the client gets none of it."""
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
        if self.last_error is None:
            log.warning("database unavailable: %s", error)
        self.last_error = error
        return StorageUnavailable("the feedback store is unavailable; retry later", self.retry_after)

    def _run(self, work, write: bool = True):
        """Run ``work(connection)`` in a transaction, creating the schema first if needed."""
        try:
            if not self.schema_ready:
                self.migrate()
            with (self.engine.begin() if write else self.engine.connect()) as connection:
                result = work(connection)
            self._recovered()
            return result
        except SQLAlchemyError as exc:  # OperationalError, DBAPIError and every other driver failure
            raise self._fail(exc) from exc

    def _recovered(self) -> None:
        if self.last_error is not None:
            log.warning("database available again")
            self.last_error = None

    def migrate(self) -> None:
        """Create the schema (idempotent) and record its version; refuse a newer schema. Version 1
        had neither block sums nor the served probabilities on labels: the replica that moves the
        version to 2 adds the columns, copies them from the predictions and builds ``label_bins``."""
        with self.engine.begin() as connection:
            _unbounded(connection)
            metadata.create_all(connection)
            found = connection.execute(sa.select(sa.func.max(schema_info.c.version))).scalar()
            if found is None:
                connection.execute(schema_info.insert().values(version=SCHEMA_VERSION))
            elif found > SCHEMA_VERSION:
                raise RuntimeError(f"database schema version {found} is newer than this service ({SCHEMA_VERSION})")
            elif found == 1 and connection.execute(
                    schema_info.update().where(schema_info.c.version == 1).values(version=2)).rowcount:
                _migrate_labels_to_v2(connection)
        self.schema_ready = True

    def ping(self) -> bool:
        """Whether the store answers now; any failure (unreachable, pool exhausted, timeout) is False."""
        try:
            with self.engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        except SQLAlchemyError as exc:
            self._fail(exc)
            return False
        self._recovered()
        return True

    # predictions -----------------------------------------------------------------------------

    def insert_predictions(self, rows: Sequence[PredictionRow]) -> None:
        """Bulk insert in one transaction (see ``_BulkInsert``)."""
        if rows:
            self._run(lambda c: _insert_predictions(c, rows))

    def fetch_predictions(self, ids: Iterable[str]) -> dict[str, sa.Row]:
        ids = list(ids)

        def work(c):
            return {row.id: row for row in c.execute(_PREDICTIONS_OF, {"ids": ids})}

        return self._run(work, write=False) if ids else {}

    def recent_confidences(self, model: str, version: str, calibration_version: int, limit: int,
                           connection=None) -> np.ndarray:
        """Calibrated confidences of the most recent predictions (labelled or not)."""
        def work(c):
            query = (sa.select(predictions.c.confidence)
                     .where(*_scope(predictions, model, version, calibration_version))
                     .order_by(predictions.c.created_at.desc()).limit(limit))
            return np.array([r[0] for r in c.execute(query)], dtype=np.float64)

        return work(connection) if connection is not None else self._run(work, write=False)

    # labels ----------------------------------------------------------------------------------

    def insert_labels(self, rows: Sequence[LabelRow], new_predictions: Sequence[PredictionRow] = ()) -> set[str]:
        """Insert labels (and offline predictions) in one transaction; returns the prediction ids that
        already had a label (duplicates, not inserted). Committed before returning."""
        def work(c):
            if new_predictions:
                _insert_predictions(c, new_predictions)
            existing = {r[0] for r in c.execute(_LABELLED_AMONG, {"ids": [r.prediction_id for r in rows]})}
            fresh = [r for r in rows if r.prediction_id not in existing]
            if fresh:
                _insert_labels(c, [tuple(vars(r).values()) for r in fresh])
                c.execute(_labels_to_blocks(c.dialect.name), {"ids": [r.prediction_id for r in fresh]})
            return existing

        return self._run(work) if rows else set()

    def window(self, model: str, version: str, calibration_version: int, n_bins: int, *, last: int | None = None,
               seconds: float | None = None, now: float | None = None, connection=None) -> WindowAggregate:
        """Bin sums of the last ``last`` labels, or of the labels of the last ``seconds`` (all labels
        when neither is given): whole blocks from ``label_bins`` plus the labels of the boundary blocks."""
        if last is not None and seconds is not None:
            raise ValueError("a window is a label count or a duration, not both")
        key_blocks = _scope(label_bins, model, version, calibration_version)
        key_labels = _scope(labels, model, version, calibration_version)

        def work(c):
            window = _Accumulator(n_bins)
            if seconds is not None:
                cutoff = (now or time.time()) - seconds
                spans = (sa.select(label_bins.c.block).where(*key_blocks).group_by(label_bins.c.block))
                inside = spans.having(sa.func.min(label_bins.c.first_at) >= cutoff)
                straddling = [b for (b,) in c.execute(spans.having(sa.func.min(label_bins.c.first_at) < cutoff,
                                                                   sa.func.max(label_bins.c.last_at) >= cutoff))]
                window.add(c.execute(_bin_totals(*key_blocks, label_bins.c.block.in_(inside))))
                if straddling:
                    rows = sa.select(*_ROW_COLUMNS).where(*key_labels, labels.c.labelled_at >= cutoff,
                                                          sa.or_(*(_in_block(b) for b in straddling)))
                    window.add(c.execute(_row_totals(rows.subquery())))
                return window.result()
            boundary = None
            if last is not None:
                counts = sa.select(label_bins.c.block, sa.func.sum(label_bins.c.count)).where(*key_blocks).group_by(
                    label_bins.c.block).order_by(label_bins.c.block.desc())
                total = 0
                for block, n in c.execute(counts):
                    if total + n > last:
                        boundary = (block, last - total)
                        break
                    total += n
            newer = [label_bins.c.block > boundary[0]] if boundary else []
            window.add(c.execute(_bin_totals(*key_blocks, *newer)))
            if boundary and boundary[1] > 0:
                rows = (sa.select(*_ROW_COLUMNS).where(*key_labels, _in_block(boundary[0]))
                        .order_by(labels.c.seq.desc()).limit(boundary[1]))
                window.add(c.execute(_row_totals(rows.subquery())))
            return window.result()

        return work(connection) if connection is not None else self._run(work, write=False)

    def newest_rows(self, model: str, version: str, calibration_version: int, limit: int, *, after_seq: int = 0,
                    count_from: int | None = None, seconds: float | None = None,
                    now: float | None = None) -> tuple[NewestRows, int | None]:
        """The most recent labelled rows with ``seq > after_seq`` (at most ``limit``, newest first; only
        those labelled in the last ``seconds`` if given), and in the same transaction the number of
        such labels with ``seq >= count_from`` (None unless asked): a caller holding earlier rows
        checks with it that none of them was deleted since and no label committed late in between."""
        scope = _scope(labels, model, version, calibration_version)
        if seconds is not None:
            scope.append(labels.c.labelled_at >= (now or time.time()) - seconds)
        query = (sa.select(labels.c.seq, labels.c.label, labels.c.probabilities, labels.c.logits)
                 .where(*scope, labels.c.seq > after_seq).order_by(labels.c.seq.desc()).limit(limit))
        counted = (None if count_from is None
                   else sa.select(sa.func.count()).select_from(labels).where(*scope, labels.c.seq >= count_from))

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
            return NewestRows(np.array([r.seq for r in rows], dtype=np.int64),
                              np.array([r.label for r in rows], dtype=np.int64), probs, logits), count

        return self._run(work, write=False)

    def recent_labels(self, model: str, version: str, calibration_version: int, limit: int) -> list[sa.Row]:
        """(seq, labelled_at, conf_bin, confidence, correct) of the most recent labels, oldest first."""
        query = (sa.select(labels.c.seq, labels.c.labelled_at, labels.c.conf_bin, labels.c.confidence, labels.c.correct)
                 .where(*_scope(labels, model, version, calibration_version))
                 .order_by(labels.c.seq.desc()).limit(limit))
        return self._run(lambda c: c.execute(query).all()[::-1], write=False)

    def labels_after(self, model: str, version: str, calibration_version: int, seq: int, connection=None):
        """(seq, correct, confidence) of the labels after ``seq``, in label order."""
        query = (sa.select(labels.c.seq, labels.c.correct, labels.c.confidence)
                 .where(*_scope(labels, model, version, calibration_version), labels.c.seq > seq)
                 .order_by(labels.c.seq))
        return (connection.execute(query).all() if connection is not None
                else self._run(lambda c: c.execute(query).all(), write=False))

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

    def locked_monitor_row(self, c: sa.Connection, model: str, version: str, calibration_version: int,
                           new_detector: str) -> sa.Row:
        """The monitor state row, write-locked until ``c`` commits: the lock is taken first by an
        UPDATE (a row lock on PostgreSQL, the database write lock on SQLite), and the row is created
        with ``new_detector`` on first use."""
        scope = _scope(monitor_state, model, version, calibration_version)
        if not c.execute(monitor_state.update().where(*scope).values(updated_at=time.time())).rowcount:
            try:
                with c.begin_nested():
                    c.execute(monitor_state.insert().values(
                        model=model, version=version, calibration_version=calibration_version, last_seq=0,
                        detector=new_detector, state=OK, since=None, reasons="[]", updated_at=time.time()))
            except IntegrityError:  # another replica created it meanwhile
                c.execute(monitor_state.update().where(*scope).values(updated_at=time.time()))
        return c.execute(sa.select(monitor_state).where(*scope).with_for_update()).one()

    def save_monitor_state(self, c: sa.Connection, model: str, version: str, calibration_version: int, *,
                           last_seq: int, detector: str, state: str, since: float | None, reasons: str,
                           previous_state: str) -> None:
        """Store the assessed state (in the transaction of ``locked_monitor_row``); a change of state is
        also recorded in ``alarm_events``."""
        c.execute(monitor_state.update().where(*_scope(monitor_state, model, version, calibration_version)).values(
            last_seq=last_seq, detector=detector, state=state, since=since, reasons=reasons, updated_at=time.time()))
        if state != previous_state:
            c.execute(alarm_events.insert().values(model=model, version=version,
                                                   calibration_version=calibration_version, at=time.time(),
                                                   from_state=previous_state, to_state=state, reasons=reasons))

    def monitor_rows(self) -> list[sa.Row]:
        return self._run(lambda c: c.execute(sa.select(monitor_state)).all(), write=False)

    def monitor_row(self, model: str, version: str, calibration_version: int) -> sa.Row | None:
        query = sa.select(monitor_state).where(*_scope(monitor_state, model, version, calibration_version))
        return self._run(lambda c: c.execute(query).first(), write=False)

    def alarm_history(self, model: str, version: str, limit: int = 50) -> list[sa.Row]:
        query = (sa.select(alarm_events).where(alarm_events.c.model == model, alarm_events.c.version == version)
                 .order_by(alarm_events.c.id.desc()).limit(limit))
        return self._run(lambda c: c.execute(query).all(), write=False)

    def purge(self, older_than: float) -> int:
        """Delete predictions (and their labels) created before ``older_than``; returns the count."""
        def work(c):
            _unbounded(c)
            old = sa.select(predictions.c.id).where(predictions.c.created_at < older_than)
            touched = c.execute(sa.select(labels.c.model, labels.c.version, labels.c.calibration_version,
                                          _BLOCK).where(labels.c.prediction_id.in_(old)).distinct()).all()
            c.execute(labels.delete().where(labels.c.prediction_id.in_(old)))
            for model, version, calibration_version, block in touched:  # rebuild the sums of the touched blocks
                c.execute(label_bins.delete().where(*_scope(label_bins, model, version, calibration_version),
                                                    label_bins.c.block == block))
                _add_to_blocks(c, _block_sums(*_scope(labels, model, version, calibration_version), _in_block(block)))
            return c.execute(predictions.delete().where(predictions.c.created_at < older_than)).rowcount

        return self._run(work)


# block sums ----------------------------------------------------------------------------------

_BLOCK = (labels.c.seq // BLOCK_LABELS).label("block")
_ROW_COLUMNS = (labels.c.seq, labels.c.conf_bin, labels.c.confidence, labels.c.correct, labels.c.nll, labels.c.brier,
                labels.c.labelled_at)
_SUM_COLUMNS = ("count", "confidence_sum", "correct_sum", "nll_sum", "brier_sum", "first_at", "last_at", "last_seq")


def _scope(table: sa.Table, model: str, version: str, calibration_version: int) -> list:
    return [table.c.model == model, table.c.version == version, table.c.calibration_version == calibration_version]


def _in_block(block: int):
    return labels.c.seq.between(block * BLOCK_LABELS, (block + 1) * BLOCK_LABELS - 1)


def _row_sums(r) -> tuple:
    """The sums ``_SUM_COLUMNS`` over label rows ``r`` (the columns of ``labels`` or of a subquery of it)."""
    return (sa.func.count(), sa.func.sum(r.confidence), sa.func.sum(r.correct), sa.func.sum(r.nll),
            sa.func.sum(r.brier), sa.func.min(r.labelled_at), sa.func.max(r.labelled_at), sa.func.max(r.seq))


def _block_sums(*where) -> sa.Select:
    """The ``label_bins`` rows of the labels matching ``where``: sums per model version, calibration
    version, block and confidence bin."""
    keys = (labels.c.model, labels.c.version, labels.c.calibration_version, _BLOCK, labels.c.conf_bin)
    return sa.select(*keys, *_row_sums(labels.c)).where(*where).group_by(*keys)


def _add_to_blocks(c: sa.Connection, sums: sa.Select) -> None:
    """Add ``sums`` into ``label_bins`` (an upsert: concurrent writers add, never overwrite)."""
    c.execute(_block_upsert(c.dialect.name, sums))


def _block_upsert(dialect: str, sums: sa.Select):
    """The statement adding ``sums`` into ``label_bins`` on ``dialect``."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
        least, greatest = sa.func.min, sa.func.max
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
        least, greatest = sa.func.least, sa.func.greatest
    else:
        raise RuntimeError(f"the feedback store supports SQLite and PostgreSQL, not {dialect}")
    keys = ("model", "version", "calibration_version", "block", "conf_bin")
    statement = insert(label_bins).from_select([*keys, *_SUM_COLUMNS], sums)
    old, new = label_bins.c, statement.excluded
    return statement.on_conflict_do_update(index_elements=list(keys), set_={
        **{name: old[name] + new[name] for name in _SUM_COLUMNS[:5]},
        "first_at": least(old.first_at, new.first_at), "last_at": greatest(old.last_at, new.last_at),
        "last_seq": greatest(old.last_seq, new.last_seq),
    })


# The statements of the feedback path, built once (building and hashing a statement costs more CPU than
# running it on a group of a few labels); ``ids`` is a list of prediction ids given at execution.
_IDS = sa.bindparam("ids", expanding=True)
_PREDICTIONS_OF = sa.select(predictions).where(predictions.c.id.in_(_IDS))
_LABELLED_AMONG = sa.select(labels.c.prediction_id).where(labels.c.prediction_id.in_(_IDS))


@functools.cache
def _labels_to_blocks(dialect: str):
    """The upsert adding the labels of the prediction ids ``ids`` to their blocks."""
    return _block_upsert(dialect, _block_sums(labels.c.prediction_id.in_(_IDS)))


def _bin_totals(*where) -> sa.Select:
    """Per-bin totals of the ``label_bins`` rows matching ``where``."""
    b = label_bins.c
    return (sa.select(b.conf_bin, sa.func.sum(b.count), sa.func.sum(b.confidence_sum), sa.func.sum(b.correct_sum),
                      sa.func.sum(b.nll_sum), sa.func.sum(b.brier_sum), sa.func.min(b.first_at), sa.func.max(b.last_at),
                      sa.func.max(b.last_seq))
            .where(*where).group_by(b.conf_bin))


def _row_totals(rows: sa.Subquery) -> sa.Select:
    """Per-bin totals of individual label rows (a subquery of ``_ROW_COLUMNS``)."""
    return sa.select(rows.c.conf_bin, *_row_sums(rows.c)).group_by(rows.c.conf_bin)


class _Accumulator:
    """Merges per-bin totals (from blocks and from rows) into one ``WindowAggregate``."""

    def __init__(self, n_bins: int):
        self.count, self.conf, self.correct = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
        self.nll = self.brier = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.last_seq = 0

    def add(self, totals) -> None:
        for b, n, s_conf, s_correct, s_nll, s_brier, t0, t1, seq in totals:  # PostgreSQL sums are Decimal
            self.count[b] += float(n)
            self.conf[b] += float(s_conf)
            self.correct[b] += float(s_correct)
            self.nll += float(s_nll)
            self.brier += float(s_brier)
            self.first = t0 if self.first is None else min(self.first, t0)
            self.last = t1 if self.last is None else max(self.last, t1)
            self.last_seq = max(self.last_seq, int(seq))

    def result(self) -> WindowAggregate:
        return WindowAggregate(BinSums(self.count, self.conf, self.correct), self.nll, self.brier, self.first,
                               self.last, self.last_seq)


def _migrate_labels_to_v2(c: sa.Connection) -> None:
    """Schema version 1 -> 2 (under the schema_info row lock): the served probabilities and logits on
    every label, and the block sums."""
    present = {column["name"] for column in sa.inspect(c).get_columns("labels")}
    binary = sa.LargeBinary().compile(dialect=c.dialect)
    for name in ("probabilities", "logits"):
        if name not in present:
            c.exec_driver_sql(f"ALTER TABLE labels ADD COLUMN {name} {binary}")
    served = {name: sa.select(predictions.c[name]).where(predictions.c.id == labels.c.prediction_id).scalar_subquery()
              for name in ("probabilities", "logits")}
    c.execute(labels.update().values(**served))
    c.execute(label_bins.delete())
    _add_to_blocks(c, _block_sums(sa.true()))
