"""The prediction log: every served prediction in a compact row, written in bulk; logits are derived on reading where
temperature scaling inverts (z = T log q + c). Every read is bounded by the id."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np
import sqlalchemy as sa

from calibkit.temperature import logits_from_probabilities, recovered_by_temperature
from service.store import legacy, partitions
from service.store.blocks import IDS
from service.store.bulk import BulkInsert
from service.store.database import Database
from service.store.dictionary import Choice, Dictionaries
from service.store.rows import (
    OFFLINE,
    PREDICTION_ID,
    CalibrationKey,
    PredictionRow,
    RecentPredictions,
    ServedAfter,
    decode_rows,
    encode_rows,
    first_id,
    id_time,
    last_id,
)
from service.store.schema import labels, prediction_log

#: The shares of ``served_after``'s samples: 256ths, from the first random byte of a prediction id.
SHARES = 256
_DRAW = 6  # the byte of a prediction id where its random bits start, after its 6-byte millisecond stamp
_LOG = prediction_log.c
_LOG_COLUMNS = ("id", "key", "offline", "probabilities", "logits", "set_members", "choice", "set_probabilities")
_insert_log = BulkInsert(prediction_log, _LOG_COLUMNS)
_KEYS: sa.BindParameter[int] = sa.bindparam("keys", expanding=True)


class Predictions:
    def __init__(self, db: Database):
        self.db = db
        self.dictionaries = Dictionaries(db)
        self._days: set[str] = set()  # the partitions this process knows exist (PostgreSQL)
        self._legacy_gone = False  # the log of schema version 2 was seen dropped

    def insert(self, rows: Sequence[PredictionRow]) -> None:
        """Bulk insert in one transaction (see ``BulkInsert``)."""
        if rows:
            compact = self.compact(rows)
            self.db.run(lambda c: self.write(c, compact))

    def compact(self, rows: Sequence[PredictionRow]) -> list[tuple]:
        """The log rows of ``rows`` (their dictionary entries added first, committed apart), without the logits the
        key's temperature gives back."""
        row_keys = [CalibrationKey(r.model, r.version, r.calibration_version) for r in rows]
        row_choices = [_choice(r) for r in rows]
        keys = self.dictionaries.key_ids(zip(row_keys, (r.temperature for r in rows)))
        choices = self.dictionaries.choice_ids([choice for choice in row_choices if choice is not None])
        # the check uses the temperature stored with the key, which reading will use, whatever the row says
        stored = {key: self.dictionaries.stored_temperature(key_id) for key, key_id in keys.items()}
        logits = _kept_logits(rows, [stored[key] for key in row_keys])
        if self.db.engine.dialect.name == "postgresql":
            self._partitions_for(rows)
        return [
            (
                r.id,
                keys[key],
                r.source == OFFLINE,
                r.probabilities,
                kept,
                r.set_members,
                None if choice is None else choices[choice],
                r.set_probabilities,
            )
            for r, key, choice, kept in zip(rows, row_keys, row_choices, logits)
        ]

    def _partitions_for(self, rows: Sequence[PredictionRow]) -> None:
        """Make the missing partitions of ``rows``' times (the upkeep makes them ahead) rather than fail the insert."""
        wanted = {partitions.partition_of(id_time(stamp)) for stamp in {r.id[:12] for r in rows}}
        if {p.name for p in wanted} <= self._days:
            return

        def work(c: sa.Connection) -> None:
            for part in wanted:
                if part.name not in self._days:
                    partitions.create(c, part.start, part.end)
            self._days = {p.name for p in partitions.existing(c)}

        self.db.run(work)

    @staticmethod
    def write(c: sa.Connection, compact: Sequence[tuple]) -> None:
        """Write ``compact`` rows (from ``compact``) on ``c``."""
        _insert_log(c, compact)

    def fetch(self, ids: Iterable[str], connection: sa.Connection | None = None) -> dict[str, PredictionRow]:
        """The stored predictions among ``ids``, by id (one probe of the primary key per calibration key); those not
        found, in the log of schema version 2 while one is left (``service.store.legacy``)."""
        ids = sorted({i for i in ids if PREDICTION_ID.fullmatch(i)})  # others were never made: not found
        if not ids:
            return {}

        def work(c: sa.Connection) -> dict[str, PredictionRow]:
            keys = self.dictionaries.all_key_ids(c)
            found: dict[str, PredictionRow] = {}
            if keys:
                query = sa.select(prediction_log).where(
                    _LOG.key.in_(_KEYS), _LOG.id.in_(IDS), _LOG.id.between(ids[0], ids[-1])
                )
                found = {row.id: row for row in self._rows(c, c.execute(query, {"keys": keys, "ids": ids}).all())}
            missing = [i for i in ids if i not in found]
            if missing and not self._legacy_gone:
                if legacy.present(c):
                    found |= legacy.fetch(c, missing)
                else:  # gone for good: an empty one made again by an older replica's start holds nothing to find
                    self._legacy_gone = True
            return found

        return work(connection) if connection is not None else self.db.run(work, write=False)

    def _rows(self, c: sa.Connection, rows: Sequence[sa.Row]) -> list[PredictionRow]:
        """Log rows as ``PredictionRow``s: time from the id, logits derived where they were left out."""
        out = []
        for row in rows:
            key, temperature = self.dictionaries.key_of(c, row.key)
            choice = self.dictionaries.choice_of(c, row.choice)
            probs = np.frombuffer(row.probabilities, dtype=np.float32)
            logits = row.logits
            if logits is None and temperature is not None and not row.offline:  # offline rows come without logits
                logits = encode_rows(logits_from_probabilities(probs[None, :], temperature))[0]
            k = int(probs.argmax())
            out.append(
                PredictionRow(
                    row.id,
                    *key,
                    id_time(row.id),
                    k,
                    float(probs[k]),
                    None,
                    row.probabilities,
                    logits,
                    OFFLINE if row.offline else "online",
                    row.set_members,
                    choice.set_coverage,
                    choice.set_method,
                    choice.set_randomized,
                    row.set_probabilities,
                    choice.priors_version,
                    temperature,
                )
            )
        return out

    def _served(self, c: sa.Connection, key: CalibrationKey) -> list | None:
        """The WHERE terms of ``key``'s served (not offline) rows; None when no row has the key."""
        key_id = self.dictionaries.key_id(c, key)
        return None if key_id is None else [_LOG.key == key_id, sa.not_(_LOG.offline)]

    def _newest(self, c: sa.Connection, key: CalibrationKey, columns: Sequence, limit: int) -> Sequence[sa.Row]:
        """``columns`` of the ``limit`` newest rows served under ``key``, newest first."""
        served = self._served(c, key)
        if served is None:
            return []
        query = sa.select(*columns).where(*served).order_by(_LOG.id.desc()).limit(limit)
        return c.execute(query).all()

    def recent_confidences(
        self, key: CalibrationKey, limit: int, connection: sa.Connection | None = None
    ) -> np.ndarray:
        """Calibrated confidences of the most recent predictions served (labelled or not); offline rows, sent with
        their labels through any feedback token, are not traffic and must not move the drift check."""

        def work(c):
            rows = self._newest(c, key, [_LOG.probabilities], limit)
            return decode_rows([r[0] for r in rows]).max(axis=1) if rows else np.zeros(0)

        return work(connection) if connection is not None else self.db.run(work, write=False)

    def recent(self, key: CalibrationKey, limit: int) -> RecentPredictions:
        """The ``limit`` most recent predictions served, newest first by id (every replica reads the same rows),
        with the label of each that has one: the rows of the label-free estimates and their check."""

        def work(c):
            rows = self._newest(c, key, [_LOG.id, _LOG.probabilities], limit)
            if not rows:
                return RecentPredictions.empty()
            ids = [r.id for r in rows]
            labelled = sa.select(labels.c.prediction_id, labels.c.label, labels.c.correct).where(
                labels.c.prediction_id.in_(IDS), labels.c.prediction_id.between(ids[-1], ids[0])
            )
            found = {r.prediction_id: r for r in c.execute(labelled, {"ids": ids})}
            return RecentPredictions(
                newest_id=ids[0],
                probs=decode_rows([r.probabilities for r in rows]),
                label=np.array([found[i].label if i in found else -1 for i in ids], dtype=np.int64),
                correct=np.array([found[i].correct if i in found else -1 for i in ids], dtype=np.int64),
            )

        return self.db.run(work, write=False)

    def served_after(
        self,
        key: CalibrationKey,
        cursor: str | None,
        until: float,
        limit: int,
        connection: sa.Connection,
        share: int = SHARES,
    ) -> ServedAfter:
        """At most ``limit`` predictions served after id ``cursor`` up to ``until``, oldest first, and where the next
        call starts; with ``share`` < ``SHARES`` a sample by the ids' first random byte."""
        served = self._served(connection, key)
        if served is None:
            return ServedAfter(last_id(until), np.zeros((0, 0)))
        sample = [] if share >= SHARES else [_sampled(connection.dialect.name, share)]
        query = (
            sa.select(_LOG.id, _LOG.probabilities)
            .where(*served, *_between(cursor, until), *sample)
            .order_by(_LOG.id)
            .limit(limit)
        )
        rows = connection.execute(query).all()
        last = rows[-1].id if len(rows) == limit else last_id(until)
        return ServedAfter(last, decode_rows([r.probabilities for r in rows]) if rows else np.zeros((0, 0)))

    def count_served(
        self, key: CalibrationKey, cursor: str | None, until: float, connection: sa.Connection, cap: int | None = None
    ) -> int:
        """How many predictions ``served_after`` would look at, counted up to ``cap`` at most."""
        served = self._served(connection, key)
        if served is None:
            return 0
        rows = sa.select(sa.literal(1)).select_from(prediction_log).where(*served, *_between(cursor, until))
        counted = sa.select(sa.func.count()).select_from((rows if cap is None else rows.limit(cap)).subquery())
        return int(connection.execute(counted).scalar_one())


def _between(cursor: str | None, until: float) -> list:
    """The id range after ``cursor`` (from the start when None) up to the last id of ``until``."""
    return [_LOG.id <= last_id(until), _LOG.id > (cursor if cursor is not None else first_id(0))]


def _sampled(dialect: str, share: int):
    """The WHERE term of the ids whose first random byte is below ``share``."""
    if dialect == "postgresql":
        return sa.func.get_byte(sa.func.uuid_send(_LOG.id), _DRAW) < share
    return sa.func.substr(_LOG.id, _DRAW + 1, 1) < sa.literal(bytes([share]), sa.LargeBinary)  # a one-byte blob


def _choice(row: PredictionRow) -> Choice | None:
    """What ``row`` was served with, None when neither a set nor adapted priors."""
    if row.set_members is None and row.priors_version is None:
        return None
    return Choice(row.set_coverage, row.set_method, row.set_randomized, row.priors_version)


def _kept_logits(rows: Sequence[PredictionRow], temperatures: Sequence[float | None]) -> list[bytes | None]:
    """Each row's logits as the log keeps them: None where its key's temperature gives them back from its
    probabilities (``recovered_by_temperature``), checked in groups of one class count."""
    kept: list[bytes | None] = [r.logits for r in rows]
    groups: dict[tuple[float, int], list[int]] = {}
    for i, (r, temperature) in enumerate(zip(rows, temperatures)):
        if r.logits is not None and temperature is not None and len(r.logits) == len(r.probabilities):
            groups.setdefault((temperature, len(r.logits)), []).append(i)
    for (temperature, _), members in groups.items():
        z = decode_rows([cast(bytes, rows[i].logits) for i in members])
        p = decode_rows([rows[i].probabilities for i in members])
        for i, recovered in zip(members, recovered_by_temperature(z, p, temperature)):
            if recovered:
                kept[i] = None
    return kept
