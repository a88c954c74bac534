"""Split conformal calibrators fitted on a part of the validation split that the temperature never saw.

The validation split is cut in two, seeded and stratified by class: the **temperature part** fits the post-hoc
calibration (temperature scaling), the **conformal part** fits the split-conformal scores (``calibkit.conformal``)
of the probabilities under that fitted calibration. The conformal guarantee, P(y in C(x)) >= 1 - alpha, needs the
calibration scores to be exchangeable with the test scores given the whole fitted predictor, temperature included
(Vovk, Gammerman & Shafer 2005; Angelopoulos et al. 2021 split their calibration set in two for the same reason when
they tune RAPS). Rows that fitted the temperature are not: it was chosen to fit them.

``conformal.json`` (``fit_conformal``) holds LAC, APS and RAPS calibrators: exact (APS and RAPS randomized by one
seeded draw per row), of the floor sets (the service's default), and both again kept per class for the weighted
quantile of label shift (``calibkit.manifest.load_conformal``); RAPS's ``k_reg`` is picked by ``pick_k_reg`` at
alpha 0.1 on the temperature part (a tuning split apart from the conformal part), lambda is 0.01.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit.conformal import SplitConformal, pick_k_reg
from calibkit.manifest import CONFORMAL_FORMAT, ConformalSpec
from training.data import split_off_fraction

#: The share of the validation split kept for the conformal scores (Angelopoulos et al. 2021 halve theirs).
DEFAULT_FRACTION = 0.5
#: RAPS's k_reg is picked for this miscoverage; lambda is the paper's penalty for small k_reg.
RAPS_ALPHA, RAPS_LAMBDA = 0.1, 0.01
#: What the artifact serves by default: RAPS at 90% coverage.
DEFAULT_METHOD, DEFAULT_COVERAGE = "raps", 0.9


@dataclass(frozen=True)
class CalibrationSplit:
    """Row indices of the validation split: ``temperature`` fits the calibration, ``conformal`` the conformal
    scores (empty when ``fraction`` is 0). Drawn by ``seed``, stratified by class."""

    temperature: np.ndarray
    conformal: np.ndarray
    seed: int
    fraction: float

    @property
    def rows(self) -> int:
        """The number of validation rows split."""
        return len(self.temperature) + len(self.conformal)


def calibration_split(labels, fraction: float, seed: int) -> CalibrationSplit:
    """Split the validation rows of ``labels`` into the temperature part and ``round(n * fraction)`` conformal rows
    (``fraction`` in [0, 1); 0 keeps every row for the temperature), drawn by ``seed`` (scikit-learn's
    ``train_test_split``, stratified by class). A ValueError names ``conformal_fraction`` when it is outside [0, 1)
    or leaves a part without some class."""
    try:
        temperature, conformal = split_off_fraction(labels, fraction, seed)
    except ValueError as exc:
        raise ValueError(f"conformal_fraction {fraction!r}: {exc}") from None
    if fraction > 0 and len(conformal) == 0:
        raise ValueError(f"conformal_fraction {fraction!r} of {len(temperature)} rows leaves no conformal rows")
    return CalibrationSplit(temperature, conformal, int(seed), float(fraction))


def fit_conformal(probs: np.ndarray, labels: np.ndarray, split: CalibrationSplit) -> dict:
    """The content of ``conformal.json`` (the module docstring): LAC, APS and RAPS fitted on the conformal rows of
    the calibrated probabilities (n, K) of the whole validation split, as the model serves them; RAPS's ``k_reg`` is
    tuned on the temperature part."""
    if len(split.conformal) == 0:
        raise ValueError("conformal_fraction 0 leaves no rows for the conformal scores")
    p, y = np.asarray(probs, dtype=np.float64), np.asarray(labels)
    p_cal, y_cal = p[split.conformal], y[split.conformal]
    k_reg = pick_k_reg(p[split.temperature], y[split.temperature], RAPS_ALPHA)
    draws = np.random.default_rng(split.seed).random(len(y_cal))
    params: dict[str, dict] = {"lac": {}, "aps": {}, "raps": {"k_reg": k_reg, "lam": RAPS_LAMBDA}}

    def fitted(floor: bool, classwise: bool) -> dict:
        options = {"classwise": classwise, "floor": floor}
        return {
            m: SplitConformal.fit(p_cal, y_cal, m, u=None if floor or m == "lac" else draws, **options, **kw).to_dict()
            for m, kw in params.items()
        }

    return {
        "format": CONFORMAL_FORMAT,
        "calibrators": fitted(floor=False, classwise=False),
        "floor_calibrators": fitted(floor=True, classwise=False),
        "class_calibrators": fitted(floor=False, classwise=True),
        "class_floor_calibrators": fitted(floor=True, classwise=True),
        "split": {
            "fitted_on": "validation",
            "rows": len(y_cal),
            "seed": split.seed,
            "fraction": split.fraction,
            "validation_rows": split.rows,
            "temperature_rows": len(split.temperature),
        },
        "draws": {
            "generator": "numpy.random.default_rng(seed).random(rows)",
            "seed": split.seed,
            "used_by": ["aps", "raps"],
        },
        "raps": {"k_reg_alpha": RAPS_ALPHA, "k_reg_fitted_on": "temperature part", "lambda": RAPS_LAMBDA},
    }


def write_conformal(data: dict, path: Path) -> ConformalSpec:
    """Write ``data`` (``fit_conformal``'s) to ``path`` and return the manifest entry with the file's SHA-256."""
    raw = json.dumps(data, indent=1).encode()
    path.write_bytes(raw)
    return ConformalSpec(
        file=path.name,
        sha256=hashlib.sha256(raw).hexdigest(),
        methods=list(data["calibrators"]),
        default_method=DEFAULT_METHOD,
        default_coverage=DEFAULT_COVERAGE,
        calibration_rows=data["split"]["rows"],
    )


def read_split(path: Path, labels) -> CalibrationSplit:
    """The split a run's ``conformal.json`` was fitted on, drawn again from its seed and fraction; a run without
    the file (``conformal_fraction`` 0, or calibrated before the split existed) fitted on every validation row."""
    if not path.is_file():
        return calibration_split(labels, 0.0, 0)
    recorded = json.loads(path.read_text())["split"]
    split = calibration_split(labels, recorded["fraction"], recorded["seed"])
    if len(split.conformal) != recorded["rows"]:
        raise ValueError(
            f"{path}: the split of seed {recorded['seed']} and fraction {recorded['fraction']} has "
            f"{len(split.conformal)} conformal rows, not the {recorded['rows']} recorded; calibrate again"
        )
    return split
