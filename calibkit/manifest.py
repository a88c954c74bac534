"""The calibration manifest: the contract between the training export and the service.

Every artifact ``artifacts/<name>/<version>/`` holds ``model.onnx`` and ``manifest.json``; this
module is the one definition of that JSON. ``load_manifest`` turns any problem into a
``ValueError`` naming the field, so a broken artifact is refused with a clear message.

The optional ``label_shift`` entry carries what estimating label shift without labels needs from the validation
split (``LabelShiftReference``); manifests written before it load with it None.

An artifact may also hold ``conformal.json``, the split-conformal calibrators fitted on a part of the
validation split kept apart from the temperature's (``ConformalSpec`` names it, with its SHA-256);
``load_conformal`` reads it back as ``calibkit.conformal.SplitConformal`` objects, checked against the manifest:
marginal, or per class (the weighted sets of label shift need the scores' labels; None for files before them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from calibkit.conformal import METHODS, SplitConformal
from calibkit.label_shift import confusion_counts
from calibkit.validation import check_probs_labels, expected

SCHEMA_VERSION: Literal[1] = 1
MANIFEST_FILE = "manifest.json"
#: The conformal calibrators' file beside the model, and the version of its layout.
CONFORMAL_FILE = "conformal.json"
CONFORMAL_FORMAT = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """The ONNX input: its name, shape (None for the dynamic batch axis) and element type.

    ``[null, C, H, W]``: images (numeric arrays, or encoded images through ``Preprocessing``);
    ``[null, F]``: feature vectors of F numbers (tabular models, embeddings), numeric only.
    """

    name: str
    shape: list[int | None] = Field(min_length=2, max_length=4)
    dtype: Literal["float32"] = "float32"

    @field_validator("shape")
    @classmethod
    def _batch_dynamic(cls, shape):
        if len(shape) not in (2, 4) or shape[0] is not None or any(d is None or d < 1 for d in shape[1:]):
            raise ValueError(expected("shape", "[null, C, H, W] or [null, F] with positive sizes", shape))
        return shape

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one row: (C, H, W) or (F,)."""
        return tuple(int(d) for d in self.shape[1:] if d is not None)

    @property
    def images(self) -> bool:
        """True for an image input [null, C, H, W]."""
        return len(self.shape) == 4


class Preprocessing(_Strict):
    """How to turn an image into the model input: decode to ``color_mode``, resize to
    ``image_size`` x ``image_size`` (``resample``), scale pixel values by ``scale`` into [0, 1]
    and, when ``invert``, take 1 - value (for data stored as ink-is-high, like scikit-learn's
    digits, while photos and scans have dark ink on light paper); layout NCHW.
    Any normalisation (mean/std) happens inside the ONNX graph."""

    color_mode: Literal["L", "RGB"]
    image_size: int = Field(ge=1)
    resample: Literal["bilinear", "nearest", "bicubic"] = "bilinear"
    scale: float = Field(default=1.0 / 255.0, gt=0)
    invert: bool = False
    layout: Literal["NCHW"] = "NCHW"
    value_range: tuple[float, float] = (0.0, 1.0)


class CalibrationSpec(_Strict):
    """The post-hoc calibration of the ``probabilities`` output, and where it was fitted."""

    method: str
    params: dict[str, Any]
    objective: str | None = None
    fitted_on: str = "validation"
    n_samples: int = Field(ge=1)
    in_graph: bool = Field(description="true when the ONNX probabilities output already applies it")

    @property
    def temperature(self) -> float | None:
        """The temperature of temperature scaling, None for other methods."""
        return float(self.params["temperature"]) if self.method == "temperature" else None


class ReferenceDistribution(_Strict):
    """Calibrated top-label confidences on the validation split: the label-free baseline against
    which the service compares live traffic (e.g. a two-sample KS test)."""

    split: str = "validation"
    confidences: list[float] = Field(min_length=1)
    accuracy: float = Field(ge=0, le=1)
    ece: float = Field(ge=0, le=1)

    @field_validator("confidences")
    @classmethod
    def _in_unit_interval(cls, values):
        outside = [v for v in values if not 0.0 <= v <= 1.0]
        if outside:
            raise ValueError(f"Expected `confidences` to lie in [0, 1], but got {outside[0]!r}")
        return sorted(values)


class LabelShiftReference(_Strict):
    """What estimating label shift needs from labelled validation rows (``calibkit.label_shift``), under the
    calibrated probabilities the ``probabilities`` output serves.

    ``priors``: the label frequencies pi_s, the source priors of EM and of the weights w = pi_t / pi_s;
    ``mean_probabilities``: the mean calibrated probability of each class on the same rows, the other estimate of pi_s
    (Alexandari et al.'s code takes it, so that EM on the validation rows themselves finds no shift); ``confusion``:
    the joint confusion counts C[i][j] of rows predicted i (the argmax) with label j, which BBSE inverts and whose
    total ``n_samples`` sets BBSE's interval. The column sums of ``confusion`` / ``n_samples`` are ``priors``.
    """

    split: str = "validation"
    n_samples: int = Field(ge=1)
    priors: list[float] = Field(min_length=2)
    mean_probabilities: list[float] = Field(min_length=2)
    confusion: list[list[int]] = Field(min_length=2)

    @classmethod
    def from_rows(cls, probs, labels, split: str = "validation") -> LabelShiftReference:
        """The entry of labelled rows: their served (calibrated) probabilities (N, K) and labels (N,).

        Raises:
            ValueError: Naming ``probs`` or ``labels`` when it fails ``calibkit.validation``'s checks.
        """
        p, y = check_probs_labels(probs, labels)
        counts = confusion_counts(p, y)
        mean = p.mean(axis=0)
        return cls(
            split=split,
            n_samples=len(y),
            priors=(counts.sum(axis=0) / len(y)).tolist(),
            mean_probabilities=(mean / mean.sum()).tolist(),
            confusion=counts.tolist(),
        )

    @model_validator(mode="after")
    def _consistent(self):
        k = len(self.priors)
        for name, values in (("priors", self.priors), ("mean_probabilities", self.mean_probabilities)):
            if len(values) != k or min(values) < 0 or abs(sum(values) - 1.0) > 1e-6:
                raise ValueError(expected(name, f"{k} non-negative numbers summing to 1", values))
        counts = self.confusion
        if any(len(row) != k or min(row) < 0 for row in counts) or len(counts) != k:
            raise ValueError(expected("confusion", f"a {k} x {k} matrix of non-negative counts", counts))
        if sum(map(sum, counts)) != self.n_samples:
            raise ValueError(expected("confusion", f"counts summing to n_samples ({self.n_samples})", counts))
        columns = [sum(row[j] for row in counts) / self.n_samples for j in range(k)]
        if any(abs(c - p) > 1e-6 for c, p in zip(columns, self.priors)):
            raise ValueError(expected("priors", f"the confusion's column sums / n_samples {columns}", self.priors))
        return self


class ConformalSpec(_Strict):
    """The split-conformal calibrators of ``file`` (``conformal.json``): which methods it holds, the one served by
    default, at which coverage, and on how many calibration rows they were fitted (rows of the validation split
    the temperature never saw, scored with the ``probabilities`` output).

    ``sha256`` is the hex SHA-256 of the file's bytes, checked by ``load_conformal`` before the file is used.
    """

    file: str = Field(default=CONFORMAL_FILE, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    methods: list[str] = Field(min_length=1)
    default_method: str
    default_coverage: float = Field(default=0.9, gt=0, lt=1)
    calibration_rows: int = Field(ge=1)

    @model_validator(mode="after")
    def _known_methods(self):
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or len(set(self.methods)) != len(self.methods):
            raise ValueError(expected("methods", f"distinct names among {list(METHODS)}", self.methods))
        if self.default_method not in self.methods:
            raise ValueError(expected("default_method", f"one of `methods` {self.methods}", self.default_method))
        return self


class Manifest(_Strict):
    """Everything the service needs to serve, explain and monitor one model version."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(pattern=r"^[0-9]+$")
    created_at: str
    model_file: str = "model.onnx"
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    class_names: list[str] = Field(min_length=2)
    input: InputSpec
    outputs: dict[str, str]
    preprocessing: Preprocessing | None = Field(
        default=None, description="how encoded images become the input; null for numeric input only"
    )
    calibration: CalibrationSpec
    metrics: dict[str, Any] = {}
    reference: ReferenceDistribution
    training: dict[str, Any] | None = None
    conformal: ConformalSpec | None = None
    label_shift: LabelShiftReference | None = Field(
        default=None, description="validation priors and confusion counts for label-shift estimation; null before them"
    )

    @model_validator(mode="after")
    def _consistent(self):
        if len(set(self.class_names)) != len(self.class_names):
            repeated = sorted({name for name in self.class_names if self.class_names.count(name) > 1})
            raise ValueError(f"Expected `class_names` to be unique, but got {repeated} more than once")
        if self.label_shift is not None and len(self.label_shift.priors) != len(self.class_names):
            raise ValueError(
                expected("label_shift.priors", f"{len(self.class_names)} numbers, one a class", self.label_shift.priors)
            )
        if not {"logits", "probabilities"} <= self.outputs.keys():
            raise ValueError(
                f"Expected `outputs` to name the 'logits' and 'probabilities' outputs, but got {sorted(self.outputs)}"
            )
        if self.preprocessing is None:
            return self
        if not self.input.images:
            raise ValueError(
                f"Expected `preprocessing` to be null for the feature-vector input {self.input.shape}, "
                "but got an image preprocessing"
            )
        channels = 1 if self.preprocessing.color_mode == "L" else 3
        wanted = [None, channels, self.preprocessing.image_size, self.preprocessing.image_size]
        if self.input.shape != wanted:
            raise ValueError(
                f"Expected `input.shape` to be {wanted} (from `preprocessing`), but got {self.input.shape}"
            )
        return self


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a ``manifest.json``; a ValueError names the file and, for an invalid manifest, each field at
    fault."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: invalid manifest: {problems}") from None


def write_manifest(manifest: Manifest, directory: str | Path) -> Path:
    """Write a manifest as ``manifest.json`` into the artifact ``directory`` and return its path; without
    ``label_shift`` it is left out, as manifests before it were."""
    path = Path(directory) / MANIFEST_FILE
    path.write_text(manifest.model_dump_json(indent=2, exclude=None if manifest.label_shift else {"label_shift"}))
    return path


def load_conformal(
    directory: str | Path,
    spec: ConformalSpec,
    class_names: Sequence[str],
    floor: bool = False,
    by_class: bool = False,
) -> dict[str, SplitConformal] | None:
    """Read the conformal calibrators that ``spec`` describes, after checking them against it.

    The file is ``{"format": 1, "calibrators": {method: SplitConformal.to_dict(), ...}, "floor_calibrators":
    {...}, "class_calibrators": {...}, "class_floor_calibrators": {...}, "split": {...}}``: the exact calibrators
    (LAC, randomized APS and RAPS), those of the floor sets (``calibkit.conformal.floor_scores``), and both with the
    scores kept per class for the weighted quantile of label shift; the last three are absent from files written
    before them. It is refused unless its bytes have ``spec.sha256``, and every method of ``spec.methods``
    is present with ``n_classes == len(class_names)`` and ``spec.calibration_rows`` scores: marginal (one threshold,
    which the served sets and their adaptation use), or, ``by_class``, classwise with the scores of the marginal
    calibrator of the same method and rule, sorted within each class. A ValueError names the file and what is wrong
    with it.

    Returns ``{method: SplitConformal}`` for each method of ``spec.methods`` (the floor sets' calibrators with
    ``floor``, the classwise ones with ``by_class``); None when ``floor`` or ``by_class`` asks for calibrators that
    the file, written before them, does not have.
    """
    path = Path(directory) / spec.file
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no conformal file") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise ValueError(f"{path}: sha256 {digest} differs from the manifest's {spec.sha256}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != CONFORMAL_FORMAT:
        shown = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: {expected('format', str(CONFORMAL_FORMAT), shown)}")
    key = "floor_calibrators" if floor else "calibrators"
    if (floor or by_class) and data.get(("class_" if by_class else "") + key) is None:
        return None
    marginal = _calibrators(path, data, key, spec, class_names, floor, None)
    if not by_class:
        return marginal
    return _calibrators(path, data, "class_" + key, spec, class_names, floor, marginal)


def _calibrators(
    path: Path,
    data: dict,
    key: str,
    spec: ConformalSpec,
    class_names: Sequence[str],
    floor: bool,
    marginal: dict[str, SplitConformal] | None,
) -> dict[str, SplitConformal]:
    """The calibrators of ``data[key]``, checked: marginal when ``marginal`` is None, else classwise with the same
    method, parameters, rule and scores as each of ``marginal``'s."""
    calibrators = data.get(key)
    if not isinstance(calibrators, dict):
        raise ValueError(f"{path}: {expected(key, 'an object of calibrators by method', calibrators)}")
    missing = [m for m in spec.methods if m not in calibrators]
    if missing:
        raise ValueError(f"{path}: the manifest's methods {missing} are not in `{key}` {sorted(calibrators)}")
    loaded = {}
    for method in spec.methods:
        where = f"{path}: {key}.{method}"
        try:
            calibrator = SplitConformal.from_dict(calibrators[method])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if calibrator.method != method:
            raise ValueError(f"{where}: {expected('method', repr(method), calibrator.method)}")
        if calibrator.floor != floor:
            raise ValueError(f"{where}: {expected('floor', str(floor).lower(), str(calibrator.floor).lower())}")
        if marginal is None and calibrator.classwise:
            raise ValueError(
                f"{where}: {expected('class_counts', 'null (served sets use one marginal threshold)', 'class counts')}"
            )
        if marginal is not None and not calibrator.classwise:
            raise ValueError(f"{where}: {expected('class_counts', 'the count of each class', None)}")
        if calibrator.n_classes != len(class_names):
            raise ValueError(
                f"{where}: {expected('n_classes', f'{len(class_names)} (the class names)', calibrator.n_classes)}"
            )
        if len(calibrator.scores) != spec.calibration_rows:
            raise ValueError(
                f"{where}: has {len(calibrator.scores)} scores but the manifest's "
                f"calibration_rows is {spec.calibration_rows}"
            )
        if marginal is not None:
            same = marginal[method]
            if (calibrator.k_reg, calibrator.lam, calibrator.randomized) != (same.k_reg, same.lam, same.randomized):
                raise ValueError(f"{where}: k_reg, lambda or randomized differ from the marginal calibrator's")
            if not np.array_equal(np.sort(calibrator.scores), same.scores):
                raise ValueError(f"{where}: its scores are not the marginal calibrator's, per class")
        loaded[method] = calibrator
    return loaded
