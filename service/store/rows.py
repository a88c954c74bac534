"""The store's vocabulary: keys, rows, prediction ids and the encoding of probability and logit vectors."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

ANONYMOUS = "anonymous"  # the source of labels sent where feedback takes no token
OFFLINE = "offline"  # the source of prediction rows scored elsewhere and sent with their labels
PREDICTION_ID = re.compile("[0-9a-f]{32}")  # what ``prediction_ids`` makes


class CalibrationKey(NamedTuple):
    """A served model version under one calibration version (0: the manifest's; refits count up)."""

    model: str
    version: str
    calibration_version: int


class PredictionRow(NamedTuple):
    """One logged prediction, its fields in the column order of ``predictions``."""

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
    set_members: bytes | None = None
    set_coverage: float | None = None
    set_method: str | None = None
    set_randomized: bool | None = None
    set_probabilities: bytes | None = None
    priors_version: str | None = None
    temperature: float | None = None  # T when the probabilities are softmax(logits / T) (None: another calibration)


@dataclass(frozen=True)
class LabelRow:
    """One label joined with what it labels; ``probabilities`` and ``logits`` are the served ones."""

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
    source: str = ANONYMOUS
    covered: int | None = None
    set_size: int | None = None
    set_coverage: float | None = None
    set_method: str | None = None
    set_randomized: bool | None = None
    set_score: float | None = None


class NewestRows(NamedTuple):
    """Labelled rows, newest first, with their probabilities as served and logits (NaN where none were stored)."""

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


class RecentPredictions(NamedTuple):
    """Served predictions, newest first: the newest one's id (None: none), their probabilities as served, and each
    one's label and whether it was right (-1 for both without a label)."""

    newest_id: str | None
    probs: np.ndarray
    label: np.ndarray
    correct: np.ndarray

    @classmethod
    def empty(cls) -> RecentPredictions:
        return cls(None, np.zeros((0, 0)), np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def labelled(self) -> np.ndarray:
        """Which rows have a label."""
        return self.correct >= 0


class ServedAfter(NamedTuple):
    """Served predictions' probabilities, oldest first, and the id the next read starts after."""

    last: str
    probs: np.ndarray


def prediction_ids(n: int, at: float | None = None) -> list[str]:
    """``n`` new prediction ids: 32 hex digits, a millisecond timestamp (now, or ``at``) then 80 random bits, like
    UUIDv7 (RFC 9562): the log is ordered, partitioned and expired by them, and inserts append to its indexes."""
    stamp = f"{(time.time_ns() // 1_000_000 if at is None else int(at * 1000)):012x}"
    digits = os.urandom(10 * n).hex()
    return [stamp + digits[20 * i : 20 * (i + 1)] for i in range(n)]


def id_time(prediction_id: str) -> float:
    """The time of a prediction id, in seconds since the epoch."""
    return int(prediction_id[:12], 16) / 1000


def first_id(at: float) -> str:
    """The smallest prediction id of time ``at`` (every id made at or after ``at`` is at least this)."""
    return f"{int(at * 1000):012x}" + "0" * 20


def last_id(at: float) -> str:
    """The largest prediction id of the millisecond of ``at``."""
    return f"{int(at * 1000):012x}" + "f" * 20


def encode_rows(matrix: np.ndarray) -> list[bytes]:
    """float32 bytes of every row of a (rows, k) array (compact storage of probabilities and logits)."""
    return [row.tobytes() for row in np.ascontiguousarray(matrix, dtype=np.float32)]


def decode_rows(blobs: list[bytes]) -> np.ndarray:
    """(rows, k) float64 from equal-length ``encode_rows`` blobs, in one conversion."""
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1).astype(np.float64)
