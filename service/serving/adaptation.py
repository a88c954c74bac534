"""Probabilities adapted to the traffic's class priors (label shift), when asked.

Under label shift the model's calibrated posterior p(y | x) becomes p_t(y | x) = w_y p(y | x) / sum_k w_k p(k | x)
with w = pi_t / pi_s (Saerens, Latinne & Decaestecker 2002). The weights served come from the label-shift alarm's
pass (``service.monitoring.shift_alarm``): EM on the drift window's stored predictions, the model's own probabilities
before any adaptation, so the estimate never feeds on itself. Their version names that window (its size and newest
prediction), so that any replica, and a later audit of the store, recomputes the same weights from it.

When a request is adapted, ``CALIB_SHIFT__ADAPT`` and its ``adapt_priors`` field decide: off by default; ``alarm``
adapts while the label-shift alarm is raised (the priors have moved beyond the tolerance, with the alarm's bounded
false-alarm rate), ``always`` whenever priors are estimated. The prediction log keeps the model's probabilities and
the priors' version of the rows served adapted.
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
    """The adaptation a request is served with: ``asked`` (its ``adapt_priors``) when given, else the setting's
    ``mode`` (off, alarm, always). Asking for it before any priors are estimated is a 422 naming the field."""
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
