"""Bring your own model: from an ONNX classifier and labelled data to a served artifact version.

As in a training run, the rows are split (``conformal_fraction``, seeded, stratified by class): temperature, vector or
bias-corrected temperature scaling is fitted on one part, on the graph's logits (or log-probabilities when it outputs
probabilities: softmax(log p) = p), and baked into a copy of the graph (``training.onnx_graph``) whose
``probabilities`` output is checked against calibkit's; the conformal scores of the other part under those served
probabilities go to ``conformal.json``. The version folder ``artifacts/<name>/<version>/`` gets a training run's
layout, so the service serves it as it is. Platt, histogram and isotonic calibration have no ONNX form here and are
refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from calibkit import metrics
from calibkit.calibrators import build_calibrator, save_calibrator
from calibkit.manifest import CONFORMAL_FILE, Preprocessing
from training import onnx_graph
from training.conformal import DEFAULT_FRACTION, calibration_split, fit_conformal, write_conformal
from training.evaluation import calibration_evaluation
from training.export import MAX_PROB_DIFF, calibration_head, sha256_of, version_directory, write_artifact_manifest
from training.inference import onnx_outputs, onnx_session
from training.report import write_report

#: Methods the graph can carry (``training.export`` bakes the same three into a trained model).
BAKED = ("temperature", "vector", "bcts")
#: The fewest conformal rows: at 0.95, split conformal needs (n + 1) 0.95 <= n, n >= 19, for a set smaller than
#: every class; one more keeps the 0.95 threshold off the largest score.
MIN_CONFORMAL_ROWS = 20
#: The fewest rows to fit the calibration on.
MIN_CALIBRATION_ROWS = 20


def load_npz(path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (float32) and ``y`` arrays from an .npz file, with a clear error for anything else."""
    if path is None:
        raise ValueError("--data is required with --onnx: an .npz file with arrays x (inputs) and y (labels)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no data file at {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not an .npz file of arrays x and y: {exc}") from None
    with data:
        missing = {"x", "y"} - set(data.files)
        if missing:
            raise ValueError(f"{path} must hold arrays 'x' and 'y'; missing {', '.join(sorted(missing))}")
        x, y = data["x"], data["y"]
    if x.dtype.kind not in "iuf" or x.dtype == bool:
        raise ValueError(f"{path}: x holds {x.dtype} values; the model input takes numbers (float32)")
    x = x.astype(np.float32)
    if y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{path}: x has {len(x)} rows but y has shape {list(y.shape)}; expected ({len(x)},) labels")
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: x holds {int((~np.isfinite(x)).sum())} NaN or infinite values")
    return x, y


def class_indices(y: np.ndarray, class_names: list[str]) -> np.ndarray:
    """Labels as class indices: integers in [0, K) or the class names themselves."""
    k = len(class_names)
    if y.dtype.kind in "US":
        index = {name: i for i, name in enumerate(class_names)}
        unknown = sorted({str(v) for v in y if str(v) not in index})
        if unknown:
            raise ValueError(f"y holds labels {unknown[:5]} that are not class names {class_names[:10]}")
        return np.array([index[str(v)] for v in y], dtype=np.int64)
    if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(np.mod(y, 1) == 0)):
        raise ValueError(f"y must hold integer class indices or class names; got {y.dtype} values")
    labels = y.astype(np.int64)
    outside = labels[(labels < 0) | (labels >= k)]
    if len(outside):
        raise ValueError(f"y holds label {int(outside[0])}, outside the model's {k} classes [0, {k - 1}]")
    return labels


def read_class_names(path: Path | None, k: int) -> list[str]:
    """Class names from a file (a JSON list, or one name a line), or "0".."K-1"; their count must be K."""
    if path is None:
        return [str(i) for i in range(k)]
    if not Path(path).is_file():
        raise FileNotFoundError(f"no class names file at {path}")
    text = Path(path).read_text()
    try:
        names = json.loads(text)
    except json.JSONDecodeError:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: expected a JSON list of strings or one class name a line")
    if len(names) != k:
        raise ValueError(f"{path} names {len(names)} classes but the model outputs {k}")
    return names


def calibrate_onnx(
    onnx_path: Path,
    data_path: Path | None,
    *,
    name: str | None = None,
    artifacts: Path = Path("artifacts"),
    class_names: Path | None = None,
    method: str = "temperature",
    objective: str = "nll",
    output_name: str | None = None,
    probabilities: bool = False,
    conformal_fraction: float = DEFAULT_FRACTION,
    seed: int = 0,
    version: str | None = None,
    overwrite: bool = False,
    n_resamples: int = 1000,
    n_bins: int = 15,
) -> dict:
    """Calibrate the classifier at ``onnx_path`` on the labelled rows of ``data_path`` and write
    ``artifacts/<name>/<version>/`` (model.onnx, manifest.json, conformal.json, calibration.json, metrics.json,
    report.md, plots/). Returns a summary; raises ``ValueError`` or ``FileNotFoundError`` naming what is wrong."""
    source = Path(onnx_path)
    if not source.is_file():
        raise FileNotFoundError(f"no ONNX model at {onnx_path}")
    if method not in BAKED:
        raise ValueError(
            f"--method {method!r} cannot be baked into the ONNX graph the service serves; use one of {list(BAKED)} "
            "(platt, histogram and isotonic are for `evaluate` on a training run)"
        )
    name = name or source.stem
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"--name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit")
    x, y_raw = load_npz(data_path)
    model = onnx_graph.load(source)
    sig = onnx_graph.signature(model, output_name)
    _check_rows(x, sig)
    probabilities = probabilities or sig.zipmap

    # the graph's logits (or log-probabilities) through its own head at T = 1: what the calibration is fitted on
    with_head = onnx_graph.calibrated_graph(model, sig, None, probabilities=probabilities)
    z = _run(with_head, x)["logits"]
    if z.ndim != 2 or z.shape[1] < 2:
        raise ValueError(f"output {sig.scores!r} has shape {list(z.shape)}; a classifier's is [N, K] with K >= 2")
    _check_scores(z, probabilities, sig.scores)
    names = read_class_names(class_names, z.shape[1])
    y = class_indices(y_raw, names)
    split = calibration_split(y, conformal_fraction, seed)
    _check_split(split, conformal_fraction)
    fitted = split.temperature
    options = {"objective": objective} if method == "temperature" else {}
    calibrator = build_calibrator(method, **options).fit(z[fitted], y[fitted])

    directory = version_directory(Path(artifacts), name, version, overwrite)
    try:
        written = _write(
            source, directory, model, sig, calibrator, z, x, y, split, names, probabilities, n_resamples, n_bins
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return written | {"model": str(onnx_path), "output": sig.scores + (" (behind a ZipMap)" if sig.zipmap else "")}


def _write(
    source, directory, model, sig, calibrator, z, x, y, split, names, probabilities, n_resamples, n_bins
) -> dict:
    """Every file of the version folder; the summary."""
    import onnx

    weights, bias, temperature = calibration_head(calibrator)  # BAKED is checked first
    onnx_path = directory / "model.onnx"
    onnx.save(
        onnx_graph.calibrated_graph(
            model, sig, len(names), probabilities=probabilities, temperature=temperature, weights=weights, bias=bias
        ),
        str(onnx_path),
    )
    served = _run(onnx_path, x)["probabilities"]
    expected = calibrator.transform(z)
    diff = float(np.max(np.abs(served - expected)))
    if diff > MAX_PROB_DIFF:
        raise ValueError(f"the calibrated graph's probabilities differ from calibkit's by {diff:.2e} > {MAX_PROB_DIFF}")
    conformal = write_conformal(fit_conformal(served, y, split), directory / CONFORMAL_FILE)
    save_calibrator(calibrator, directory / "calibration.json")
    held_out, fitted = split.conformal, split.temperature
    rows = {"fitted rows": (z[fitted], y[fitted]), "held-out rows": (z[held_out], y[held_out])}
    evaluation = calibration_evaluation(calibrator, rows, (n_resamples, n_resamples), n_bins)
    evaluation["rows"] = dict(fitted=len(fitted), held_out=len(held_out), seed=split.seed, fraction=split.fraction)
    (directory / "metrics.json").write_text(json.dumps(evaluation, indent=2))
    images = len(sig.row_dims) == 3
    row_shape = list(x.shape[1:])
    manifest = write_artifact_manifest(
        directory,
        calibrator,
        len(fitted),
        expected,
        y,
        class_names=names,
        input_name=sig.input_name,
        row_shape=row_shape,
        preprocessing=_preprocessing(row_shape) if images else None,
        ece=metrics.ece(expected, y, n_bins),
        metrics={"validation": evaluation["validation"], "test": evaluation["test"]},
        training={
            "source": "python -m training calibrate --onnx",
            "onnx_file": source.name,
            "onnx_sha256": sha256_of(source),
            "output": sig.scores,
            "output_holds": "probabilities" if probabilities else "logits",
            "zipmap": sig.zipmap,
            "export_parity": {"n": len(x), "max_abs_diff_probabilities": diff},
        },
        conformal=conformal,
        split="your data, every row",
        fitted_on="your data",
    )
    summary = {
        "data": f"{len(y)} labelled rows of shape {row_shape}: calibration fitted on {len(fitted)}, conformal "
        f"scores and the held-out figures on {len(held_out)} (seed {split.seed})",
        "calibration": f"{calibrator.method} {json.dumps(calibrator.to_dict()['params'])[:120]}",
        "input": f"{sig.input_name} {manifest.input.shape}" + ("" if images else " (numbers only)"),
    }
    write_report(
        directory,
        f"Calibration report: {manifest.name} (your model)",
        evaluation,
        summary,
        z[held_out],
        y[held_out],
        calibrator,
        n_bins,
        ("Held-out rows", "the held-out rows"),
    )
    return {
        "artifact": str(directory),
        "n": len(y),
        "calibration": calibrator.to_dict(),
        "held_out": {
            stage: {m: evaluation["test"][stage][m]["value"] for m in ("ece", "nll", "accuracy")}
            for stage in ("before", "after")
        },
        "held_out_ece_ci": evaluation["test"]["after"]["ece"]["ci"],
        "max_abs_diff_probabilities": diff,
        "conformal": {"methods": conformal.methods, "calibration_rows": conformal.calibration_rows},
        "serve": f"python -m service --artifacts {directory.parent.parent}",
    }


def _preprocessing(row_shape: list[int]) -> Preprocessing | None:
    """Image preprocessing for a one- or three-channel square input; None (numbers only) for any other."""
    c, h, w = row_shape
    if c not in (1, 3) or h != w:
        return None
    return Preprocessing(color_mode="L" if c == 1 else "RGB", image_size=h)


def _run(model_or_path, x: np.ndarray) -> dict[str, np.ndarray]:
    """``logits`` and ``probabilities`` of a calibrated graph (a ModelProto or a file) on ``x``, as float64."""
    source = model_or_path if isinstance(model_or_path, Path) else model_or_path.SerializeToString()
    try:
        return onnx_outputs(onnx_session(source), x)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidArgument / RuntimeException types
        raise ValueError(f"onnxruntime could not run the model on x: {exc}") from None


def _check_rows(x: np.ndarray, sig: onnx_graph.Signature) -> None:
    """``x``'s rows have the input's rank and its fixed dims."""
    dims = sig.row_dims
    if x.ndim != 1 + len(dims) or any(d is not None and d != s for d, s in zip(dims, x.shape[1:])):
        shown = ", ".join("?" if d is None else str(d) for d in dims)
        raise ValueError(
            f"x has rows of shape {list(x.shape[1:])}; the model's input {sig.input_name!r} takes [N, {shown}]"
        )


def _check_scores(z: np.ndarray, probabilities: bool, output: str) -> None:
    """Finite logits; and a probability output flagged as one."""
    if not np.isfinite(z).all():
        raise ValueError(f"output {output!r} holds NaN or infinite values on x")
    if probabilities:
        sums = np.exp(z).sum(axis=1)
        if not np.allclose(sums, 1.0, atol=1e-3):
            worst = float(sums[np.argmax(np.abs(sums - 1.0))])
            raise ValueError(
                f"--probabilities: output {output!r} rows sum to {worst:.4g}, not 1; drop --probabilities for logits"
            )
    elif np.all((z >= 0) & (z <= 1)) and np.allclose(z.sum(axis=1), 1.0, atol=1e-5):
        raise ValueError(
            f"output {output!r} holds probabilities (every row in [0, 1], summing to 1): pass --probabilities"
        )


def _check_split(split, fraction: float) -> None:
    if len(split.conformal) < MIN_CONFORMAL_ROWS:
        raise ValueError(
            f"{split.rows} rows at --conformal-fraction {fraction} leave {len(split.conformal)} for the conformal "
            f"scores; at least {MIN_CONFORMAL_ROWS} are needed (sets at 0.95 need (n + 1) x 0.95 <= n): send more "
            "labelled rows or a larger fraction"
        )
    if len(split.temperature) < MIN_CALIBRATION_ROWS:
        raise ValueError(
            f"{split.rows} rows at --conformal-fraction {fraction} leave {len(split.temperature)} to fit the "
            f"calibration on; at least {MIN_CALIBRATION_ROWS} are needed"
        )
