"""Probabilities adapted to the traffic's class priors: p_t(y | x) = w_y p(y | x) / sum_k w_k p(k | x) with
w = pi_t / pi_s (Saerens, Latinne & Decaestecker 2002), the weights by EM on the drift window. ``CALIB_SHIFT__ADAPT``
and a request's ``adapt_priors`` decide: off by default, ``alarm`` while the alarm is raised, or ``always``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from calibkit.label_shift import adapt_probabilities
from service.errors import InvalidInput
from service.serving.scoring import ScoredBatch


@dataclass(frozen=True)
class Adaptation:
    """The class priors served adaptations use: their version, the weights w = pi_t / pi_s (K,), the priors, and
    whether the label-shift alarm was raised when they were read."""

    version: str
    weights: np.ndarray
    priors: tuple[float, ...]
    alarmed: bool

    @classmethod
    def from_json(cls, saved: str | None, alarmed: bool) -> Adaptation | None:
        """The priors stored with the label-shift state (None when none were estimated)."""
        if saved is None:
            return None
        data = json.loads(saved)
        return cls(data["version"], np.asarray(data["weights"], dtype=np.float64), tuple(data["priors"]), alarmed)


def chosen(mode: str, found: Adaptation | None, asked: bool | None, field: str = "adapt_priors") -> Adaptation | None:
    """The adaptation a request is served with: ``asked``, else ``mode`` (422 before any priors)."""
    if asked is False:
        return None
    if asked is True:
        if found is None:
            raise InvalidInput(
                "no class priors are estimated for this model version yet: they need the manifest's label_shift "
                "entry and served predictions (see label_shift of GET /calibration)",
                field=field,
            )
        return found
    if found is None or mode == "off" or (mode == "alarm" and not found.alarmed):
        return None
    return found


def adapted(scored: ScoredBatch, adaptation: Adaptation) -> ScoredBatch:
    """The rows' probabilities, predicted class and confidence after the adaptation (the rest as scored)."""
    probs = adapt_probabilities(scored.probabilities, adaptation.weights)
    predicted = probs.argmax(axis=1)
    return replace(
        scored,
        probabilities=probs,
        predicted=predicted.tolist(),
        confidence=probs[np.arange(len(probs)), predicted].tolist(),
    )
