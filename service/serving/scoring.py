"""The scored batch that both protocols answer and the log stores; probabilities are ``softmax(logits / T)`` under a
refitted temperature T (Guo et al. 2017, Sec. 4.2), else the graph's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, cast

import numpy as np

from calibkit.temperature import apply_temperature, softmax
from service.serving.conformal import ServedSets
from service.store.rows import PredictionRow, encode_rows, prediction_ids


@dataclass(frozen=True)
class ScoredBatch:
    """Per row: its id, probabilities, logits, class, confidences and the vectors the log stores (None: off)."""

    ids: list[str]
    probabilities: np.ndarray
    logits: np.ndarray
    uncalibrated: np.ndarray
    predicted: list[int]
    confidence: list[float]
    raw_confidence: list[float]
    probability_bytes: Sequence[bytes | None]
    logit_bytes: Sequence[bytes | None]
    graph_probability_bytes: Sequence[bytes | None]
    calibration_version: int
    temperature: float | None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice) -> ScoredBatch:
        """The rows ``rows`` (what the batcher hands each request)."""
        per_row = {name: getattr(self, name)[rows] for name in _PER_ROW}
        return ScoredBatch(**per_row, calibration_version=self.calibration_version, temperature=self.temperature)

    def prediction_rows(
        self,
        model: str,
        version: str,
        now: float | None = None,
        sets: ServedSets | None = None,
        priors_version: str | None = None,
    ) -> list[PredictionRow]:
        """The rows as the log stores them, with their sets and the version of the priors served (None: none)."""
        now = time.time() if now is None else now
        if len(self) and self.probability_bytes[0] is None:  # ``score`` encodes every row of a batch or none
            raise ValueError("rows scored without encode=True have no encodings to log")
        probability_bytes = cast(Sequence[bytes], self.probability_bytes)
        packed: Sequence[bytes | None] = [None] * len(self) if sets is None else sets.packed()
        coverage, method = (None, None) if sets is None else (sets.choice.coverage, sets.choice.method)
        randomized = None if sets is None else sets.choice.randomized
        set_probabilities = [None] * len(self) if sets is None else self.graph_probability_bytes
        return [
            PredictionRow(
                self.ids[i],
                model,
                version,
                self.calibration_version,
                now,
                k,
                self.confidence[i],
                self.raw_confidence[i],
                probability_bytes[i],
                self.logit_bytes[i],
                "online",
                packed[i],
                coverage,
                method,
                randomized,
                set_probabilities[i],
                priors_version,
                self.temperature,
            )
            for i, k in enumerate(self.predicted)
        ]


@dataclass(frozen=True)
class InferenceResult:
    """One batch's graph outputs, its scored rows and their default sets; when the service adapts to the class priors
    by default, also the ``adaptation``, the adapted rows and their sets. ``result[a:b]`` is one request's share."""

    outputs: dict[str, np.ndarray]
    scored: ScoredBatch
    sets: ServedSets | None = None
    adaptation: Any = None  # service.serving.adaptation.Adaptation (which imports this module)
    adapted: ScoredBatch | None = None
    adapted_sets: ServedSets | None = None

    def __len__(self) -> int:
        return len(self.scored)

    def __getitem__(self, rows: slice) -> InferenceResult:
        return InferenceResult(
            {name: value[rows] for name, value in self.outputs.items()},
            self.scored[rows],
            None if self.sets is None else self.sets[rows],
            self.adaptation,
            None if self.adapted is None else self.adapted[rows],
            None if self.adapted_sets is None else self.adapted_sets[rows],
        )


_PER_ROW = tuple(f.name for f in fields(ScoredBatch) if f.name not in ("calibration_version", "temperature"))


def score(
    logits: np.ndarray,
    graph_probabilities: np.ndarray,
    calibration_version: int,
    temperature: float | None,
    *,
    encode: bool,
) -> ScoredBatch:
    """Score one batch under the calibration in force (``encode``: with the encodings the log stores)."""
    logits = logits.astype(np.float64)
    if calibration_version == 0:
        probs = graph_probabilities.astype(np.float64)
    else:
        assert temperature is not None  # every refitted calibration version is a temperature
        probs = apply_temperature(logits, temperature)
    uncalibrated = softmax(logits)
    n = len(probs)
    predicted = probs.argmax(axis=1)
    return ScoredBatch(
        ids=prediction_ids(n),
        probabilities=probs,
        logits=logits,
        uncalibrated=uncalibrated,
        predicted=predicted.tolist(),
        confidence=probs[np.arange(n), predicted].tolist(),
        raw_confidence=uncalibrated.max(axis=1).tolist(),
        probability_bytes=encode_rows(probs) if encode else [None] * n,
        logit_bytes=encode_rows(logits) if encode else [None] * n,
        graph_probability_bytes=encode_rows(graph_probabilities) if encode and calibration_version else [None] * n,
        calibration_version=calibration_version,
        temperature=temperature,
    )
