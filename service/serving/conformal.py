"""Prediction sets served per request, computed from the artifact's own calibrated probabilities even after a refit:
split conformal's guarantee needs scores exchangeable with the calibration split's (Angelopoulos et al. 2021,
``calibkit.conformal``). By default the **floor sets**: never empty, coverage at least 1 - alpha. On request the
**exact sets** (randomized APS and RAPS drawn per prediction id, LAC): coverage 1 - alpha to within 1 / (n + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibkit.conformal import SplitConformal, conformity_scores, prediction_sets
from calibkit.conformal.adaptive import LogQuantileTracker, served_ranked_sets
from calibkit.manifest import Manifest, load_conformal
from service.errors import InvalidInput

_ID_DRAW = slice(12, 25)  # a prediction id's 52 random bits after its millisecond stamp: its row's uniform draw


def covered(packed: bytes, label: int) -> bool:
    """Whether a logged set (``ServedSets.packed``) holds class ``label``."""
    return bool(packed[label // 8] >> (7 - label % 8) & 1)


def set_size(packed: bytes) -> int:
    """The number of classes in a logged set."""
    return int(np.unpackbits(np.frombuffer(packed, dtype=np.uint8)).sum())


def row_draws(ids: list[str]) -> np.ndarray:
    """One uniform draw in [0, 1) per prediction id, a function of the id alone."""
    return np.array([int(i[_ID_DRAW], 16) for i in ids], dtype=np.float64) / float(16**13)


def _draws(calibrator: SplitConformal, ids: list[str], randomized: bool) -> np.ndarray | None:
    """The rows' draws under an exact rule that randomizes (APS and RAPS; LAC never does)."""
    return row_draws(ids) if randomized and calibrator.method != "lac" else None


def _rule(calibrator: SplitConformal, draws: np.ndarray | None) -> dict[str, Any]:
    """The keyword arguments of a calibrator's score rule with the rows' draws."""
    return {"k_reg": calibrator.k_reg, "lam": calibrator.lam, "u": draws, "floor": calibrator.floor}


@dataclass(frozen=True)
class SetChoice:
    """What a request asks for: score, coverage 1 - alpha, p-values, and exact or floor sets."""

    method: str
    coverage: float
    p_values: bool = False
    randomized: bool = False

    @property
    def key(self) -> tuple[str, float, bool]:
        """What the adaptive state and the coverage series are kept by (the p-values change no set)."""
        return self.method, self.coverage, self.randomized


@dataclass(slots=True, eq=False)
class ServedSets:
    """The sets of some rows under one choice: row i's set is ``order[i, :sizes[i]]``, most probable first; slotted and
    not frozen (a frozen dataclass builds slower)."""

    choice: SetChoice
    order: np.ndarray
    sizes: np.ndarray
    p_values: np.ndarray | None
    threshold: float
    threshold_version: str
    randomized: bool
    ranked: list[list[int]] | None = None
    bits: list[bytes] | None = None
    described: dict | None = None
    _flat: np.ndarray | None = field(default=None, init=False, repr=False)

    def __getitem__(self, rows: slice) -> ServedSets:
        return ServedSets(
            self.choice,
            self.order[rows],
            self.sizes[rows],
            None if self.p_values is None else self.p_values[rows],
            self.threshold,
            self.threshold_version,
            self.randomized,
            None if self.ranked is None else self.ranked[rows],
            None if self.bits is None else self.bits[rows],
            self.described,
        )

    @property
    def flat(self) -> np.ndarray:
        """Every row's members, most probable first, row after row (computed once)."""
        if self._flat is None:
            self._flat = self.order[np.arange(self.order.shape[1]) < self.sizes[:, None]]
        return self._flat

    @property
    def members(self) -> np.ndarray:
        """Membership (N, K) in class order, as v2's ``prediction_set`` output answers it."""
        out = np.zeros(self.order.shape, dtype=bool)
        out[np.repeat(np.arange(len(out)), self.sizes), self.flat] = True
        return out

    def listed(self) -> ServedSets:
        """Fill in for the whole batch (on the inference thread, so a request's share is a slice) the members, packed
        bits and description every response and log row needs; returns these sets."""
        self.ranked, self.bits, self.described = self.members_ranked(), self.packed(), self.info()
        return self

    def members_ranked(self) -> list[list[int]]:
        """Each row's set as class indices, most probable first (ties in class order)."""
        if self.ranked is not None:
            return self.ranked
        flat = self.flat.tolist()
        out, start = [], 0
        for size in self.sizes.tolist():
            out.append(flat[start : start + size])
            start += size
        return out

    def packed(self) -> list[bytes]:
        """Each row's membership as packed bits (``numpy.packbits``, class 0 the first bit), as the log stores it."""
        if self.bits is not None:
            return self.bits
        packed = np.packbits(self.members, axis=1)
        raw, width = packed.tobytes(), packed.shape[1]
        return [raw[i : i + width] for i in range(0, len(raw), width)]

    def info(self) -> dict:
        """The response's description of the sets (a threshold of +inf is null), shared in a batch."""
        if self.described is not None:
            return self.described
        return {
            "method": self.choice.method,
            "coverage": self.choice.coverage,
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "threshold_version": self.threshold_version,
            "randomized": self.randomized,
        }


class ModelSets:
    """A model version's conformal calibrators by method, exact and floor, with its defaults and the coverage levels
    it serves, or the reason it serves no sets."""

    def __init__(
        self,
        calibrators: dict[str, SplitConformal],
        default_method: str | None = None,
        default_coverage: float | None = None,
        checksum: str = "",
        reason: str | None = None,
        *,
        floors: dict[str, SplitConformal] | None = None,
        levels: tuple[float, ...] = (),
        randomized: bool = False,
        by_class: dict[str, SplitConformal] | None = None,
        floors_by_class: dict[str, SplitConformal] | None = None,
    ):
        self.calibrators = calibrators
        self.by_class, self.floors_by_class = by_class, floors_by_class
        self._weighted: dict[tuple, np.ndarray] = {}  # per-class thresholds by (set choice, priors version)
        self.floors = floors if floors is not None else {m: replace(c, floor=True) for m, c in calibrators.items()}
        self.floors_fitted = floors is not None
        self.default_method = default_method
        self.default_coverage = default_coverage
        self.levels = tuple(sorted({*levels, *([default_coverage] if default_coverage is not None else [])}))
        self.default_randomized = randomized
        self.checksum = checksum
        self.reason = reason
        self._adapted: dict[tuple[str, float, bool], LogQuantileTracker] = {}

    def adapt(self, states: dict[tuple[str, float, bool], LogQuantileTracker]) -> None:
        """Serve these adaptive levels by (method, coverage, randomized) from now on."""
        self._adapted = dict(states)

    @classmethod
    def load(
        cls,
        directory: Path,
        manifest: Manifest,
        method: str | None = None,
        coverage: float | None = None,
        levels: tuple[float, ...] = (),
        randomized: bool = False,
    ) -> ModelSets:
        """The calibrators of an artifact version (checked against the manifest's checksum), or none and why; raises
        ``ValueError`` when the scores do not match. Without floor scores floor sets use the exact ones."""
        spec = manifest.conformal
        if spec is None:
            return cls({}, reason="the artifact has no conformal scores (exported before prediction sets existed)")
        calibrators = load_conformal(directory, spec, manifest.class_names)
        assert calibrators is not None  # the exact calibrators are always there
        floors = load_conformal(directory, spec, manifest.class_names, floor=True)
        by_class = load_conformal(directory, spec, manifest.class_names, by_class=True)
        floors_by_class = load_conformal(directory, spec, manifest.class_names, floor=True, by_class=True)
        chosen = method or spec.default_method
        if chosen not in calibrators:
            raise ValueError(f"conformal method {chosen!r} is not in the artifact's {sorted(calibrators)}")
        default = coverage or spec.default_coverage
        return cls(
            calibrators,
            chosen,
            default,
            spec.sha256[:12],
            floors=floors,
            levels=levels,
            randomized=randomized,
            by_class=by_class,
            floors_by_class=floors_by_class,
        )

    @property
    def available(self) -> bool:
        return bool(self.calibrators)

    def calibrator(self, method: str, randomized: bool) -> SplitConformal:
        """The calibrator of a set rule: the exact one (randomized APS and RAPS, LAC without floor) or the floor's."""
        return self.calibrators[method] if randomized else self.floors[method]

    def describe(self) -> dict:
        """What ``/models`` says about the version's sets."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "methods": sorted(self.calibrators),
            "default_method": self.default_method,
            "default_coverage": self.default_coverage,
            "levels": list(self.levels),
            "randomized": self.default_randomized,
            "floor_scores": "fitted"
            if self.floors_fitted
            else "the exact scores (conservative: exported before floor sets)",
            "calibration_rows": {m: len(c.scores) for m, c in self.calibrators.items()},
            "threshold_version": self.version(0),
            "label_shift_sets": self.by_class is not None,
        }

    def version(self, folded: int) -> str:
        """The threshold's version: the conformal file's checksum and the labels folded into it."""
        return f"{self.checksum}:{folded}"

    def choice(
        self,
        method: str | None,
        coverage: float | None,
        p_values: bool,
        field: str = "",
        randomized: bool | None = None,
    ) -> SetChoice | None:
        """A request's choice with the defaults for what it leaves out; None when it asks for nothing and the version
        has no sets. Sets from a version without them, or a coverage it does not serve, is a 422 naming the field."""
        if not self.available:
            asked = [name for name, value in (("coverage", coverage), ("set_method", method)) if value is not None]
            if p_values:
                asked.append("return_p_values")
            if randomized:
                asked.append("randomized")
            if asked:
                raise InvalidInput(
                    f"this model version serves no prediction sets: {self.reason}", field=field + asked[0]
                )
            return None
        chosen = method or self.default_method
        if chosen not in self.calibrators:
            raise InvalidInput(
                f"{chosen!r} is not a set method of this model version; it has {sorted(self.calibrators)}",
                field=field + "set_method",
            )
        assert self.default_coverage is not None  # set whenever there are calibrators
        level = self.default_coverage if coverage is None else coverage
        if level not in self.levels:
            raise InvalidInput(
                f"coverage {coverage!r} is not served; the levels served are {list(self.levels)}",
                field=field + "coverage",
            )
        exact = self.default_randomized if randomized is None else randomized
        return SetChoice(chosen, float(level), p_values, exact)

    def sets(self, probs: np.ndarray, ids: list[str], choice: SetChoice) -> ServedSets:
        """The sets (and p-values, Vovk et al. 2005) of rows ``probs``, at the adapted level when one is served."""
        calibrator = self.calibrator(choice.method, choice.randomized)
        draws = _draws(calibrator, ids, choice.randomized)
        adapted = self._adapted.get(choice.key)
        if adapted is None:
            threshold, version = float(calibrator.quantile(1.0 - choice.coverage)), self.version(0)
        else:
            threshold, version = adapted.threshold(calibrator), self.version(adapted.labels)
        # the graph's softmax of finite inputs (``preprocessing`` refuses others) and draws from ids: nothing to check
        order, sizes = served_ranked_sets(calibrator, probs, threshold, u=draws, check_input=False)
        p = calibrator.p_values(probs, u=draws).astype(np.float32) if choice.p_values else None
        return ServedSets(choice, order, sizes, p, threshold, version, choice.randomized)

    def label_shift_sets(
        self, probs: np.ndarray, ids: list[str], choice: SetChoice, weights: np.ndarray, priors_version: str
    ) -> ServedSets | None:
        """The sets adapted to new class priors: the weighted split-conformal quantile of Podkopaev & Ramdas 2021,
        w = pi_t / pi_s, per candidate class; None without per-class scores. A set's members lead ``order``."""
        found = self.by_class if choice.randomized else self.floors_by_class
        if found is None:
            return None
        calibrator = found[choice.method]
        draws = _draws(calibrator, ids, choice.randomized)
        thresholds = self._weighted.get((choice.key, priors_version))
        if thresholds is None:  # once per priors version: the weighted quantile sorts and sums every class's scores
            thresholds = calibrator.label_shift_quantiles(weights, 1.0 - choice.coverage)
            if len(self._weighted) >= 64:
                self._weighted.clear()
            self._weighted[(choice.key, priors_version)] = thresholds
        members = prediction_sets(probs, thresholds, calibrator.method, **_rule(calibrator, draws))
        ranked = np.argsort(-probs, axis=1, kind="stable")
        order = np.take_along_axis(
            ranked, np.argsort(~np.take_along_axis(members, ranked, axis=1), axis=1, kind="stable"), axis=1
        )
        p = self.calibrator(choice.method, choice.randomized).p_values(probs, u=draws) if choice.p_values else None
        return ServedSets(
            choice,
            order,
            members.sum(axis=1),
            None if p is None else p.astype(np.float32),
            math.nan,
            f"{self.checksum}:priors={priors_version}",
            choice.randomized,
        )

    def label_scores(
        self, probs: np.ndarray, labels: np.ndarray, ids: list[str], method: str, randomized: bool
    ) -> np.ndarray:
        """The conformity scores of labelled rows under the rule their sets were served by."""
        calibrator = self.calibrator(method, randomized)
        return conformity_scores(
            probs, labels, calibrator.method, **_rule(calibrator, _draws(calibrator, ids, randomized))
        )
