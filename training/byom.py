"""Bring-your-own-model calibration: fit a calibrator for any ONNX classifier from labelled data.

The user's model is run on onnxruntime over validation inputs; the calibrator is fitted on its
logits (or on log-probabilities when it outputs probabilities: softmax(log p) = p). For temperature
scaling a calibrated copy of the graph is written too, with outputs ``logits`` and
``probabilities`` = softmax(logits / T), so any ONNX consumer gets calibrated probabilities.

As in a training run, the data are split (``conformal_fraction``, seeded, stratified by class): the calibrator is
fitted on one part, and the conformal scores of the other part under the calibrated probabilities (those of the
calibrated graph's ``probabilities`` output for temperature scaling) go to ``<model>.conformal.json``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibkit import metrics
from calibkit.calibrators import build_calibrator, save_calibrator
from calibkit.temperature import softmax
from calibkit.validation import check_probs
from training.conformal import DEFAULT_FRACTION, calibration_split, fit_conformal, write_conformal
from training.inference import onnx_outputs, onnx_session


def load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` arrays from an .npz file, with a clear error for anything else."""
    if path is None:
        raise ValueError("--data is required with --onnx: an .npz file with arrays x (inputs) and y (labels)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no data file at {path}")
    with np.load(path) as data:
        missing = {"x", "y"} - set(data.files)
        if missing:
            raise ValueError(f"{path} must hold arrays 'x' and 'y'; missing {', '.join(sorted(missing))}")
        x, y = data["x"].astype(np.float32), data["y"]
    if len(x) != len(y):
        raise ValueError(f"{path}: x has {len(x)} rows but y has {len(y)} labels")
    return x, y


def calibrate_onnx(
    onnx_path: Path,
    data_path: Path,
    *,
    method: str = "temperature",
    objective: str = "nll",
    output_name: str | None = None,
    probabilities: bool = False,
    out: Path | None = None,
    conformal_fraction: float = DEFAULT_FRACTION,
    seed: int = 0,
) -> dict:
    """Fit ``method`` on the model's outputs for part of ``data_path``; write the calibration JSON,
    for temperature scaling ``<model>.calibrated.onnx``, and unless ``conformal_fraction`` is 0 the conformal
    scores of the other part in ``<model>.conformal.json`` beside the calibration JSON. Returns a summary."""
    if not Path(onnx_path).is_file():
        raise FileNotFoundError(f"no ONNX model at {onnx_path}")
    x, y = load_npz(data_path)
    session = onnx_session(onnx_path)
    names = [o.name for o in session.get_outputs()]
    name = output_name or ("logits" if "logits" in names else names[0])
    if name not in names:
        raise ValueError(f"--output-name {name!r} is not an output of {onnx_path}; outputs: {', '.join(names)}")
    raw = onnx_outputs(session, x)[name]
    z = np.log(np.clip(check_probs(raw), 1e-300, 1.0)) if probabilities else raw
    split = calibration_split(y, conformal_fraction, seed)
    fitted = split.temperature
    options = {"objective": objective} if method == "temperature" else {}
    calibrator = build_calibrator(method, **options).fit(z[fitted], y[fitted])
    out = out or Path(onnx_path).with_suffix(".calibration.json")
    save_calibrator(calibrator, out)
    before, after = softmax(z), calibrator.transform(z)
    summary = {
        "model": str(onnx_path),
        "output": name,
        "n": int(len(y)),
        "calibration": calibrator.to_dict(),
        "written": [str(out)],
        "in_sample": _scores(before, after, y, fitted),
        "note": "in-sample numbers (fitted and measured on the same data); evaluate on held-out data",
    }
    served = after
    if method == "temperature":
        calibrated = Path(onnx_path).with_name(Path(onnx_path).stem + ".calibrated.onnx")
        append_temperature(Path(onnx_path), calibrated, name, calibrator.temperature, probabilities)
        served = onnx_outputs(onnx_session(calibrated), x)["probabilities"]
        summary["max_abs_diff_probabilities"] = float(np.max(np.abs(served - after)))
        summary["written"].append(str(calibrated))
    if len(split.conformal):
        conformal_out = Path(out).with_name(Path(onnx_path).stem + ".conformal.json")
        spec = write_conformal(fit_conformal(served, y, split), conformal_out)
        summary["conformal"] = {
            "file": str(conformal_out),
            "sha256": spec.sha256,
            "methods": spec.methods,
            "calibration_rows": spec.calibration_rows,
            "calibration_fitted_on_rows": len(fitted),
            "seed": split.seed,
            "fraction": split.fraction,
        }
        summary["held_out"] = _scores(before, after, y, split.conformal)
        summary["note"] = (
            f"in_sample: the {len(fitted)} rows the calibration was fitted on; held_out: the other "
            f"{len(split.conformal)}, which fitted the conformal scores instead"
        )
        summary["written"].append(str(conformal_out))
    return summary


def _scores(before: np.ndarray, after: np.ndarray, y: np.ndarray, rows: np.ndarray) -> dict:
    """ECE, NLL and accuracy of the uncalibrated and calibrated probabilities on ``rows``."""
    return {
        stage: {
            "ece": metrics.ece(p[rows], y[rows]),
            "nll": metrics.nll(p[rows], y[rows]),
            "accuracy": metrics.accuracy(p[rows], y[rows]),
        }
        for stage, p in (("before", before), ("after", after))
    }


def append_temperature(src: Path, dst: Path, output: str, temperature: float, probabilities: bool) -> None:
    """Copy the ONNX graph at ``src`` to ``dst`` with outputs ``logits`` (the model's output, or its
    log for a probability output) and ``probabilities`` = softmax(logits / T)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    value_info = next(o for o in graph.output if o.name == output)
    raw = "byom_raw_output"
    # The new outputs are called logits and probabilities: move any existing tensor of those names away.
    renames = {output: raw} | {n: f"byom_original_{n}" for n in ("logits", "probabilities") if n != output}
    for node in graph.node:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    graph.initializer.append(numpy_helper.from_array(np.array(temperature, dtype=np.float32), "byom_temperature"))
    graph.node.append(helper.make_node("Log" if probabilities else "Identity", [raw], ["logits"]))
    graph.node.append(helper.make_node("Div", ["logits", "byom_temperature"], ["byom_scaled_logits"]))
    graph.node.append(helper.make_node("Softmax", ["byom_scaled_logits"], ["probabilities"], axis=-1))
    outputs = []
    for new_name in ("logits", "probabilities"):
        info = onnx.ValueInfoProto()
        info.CopyFrom(value_info)
        info.name = new_name
        outputs.append(info)
    del graph.output[:]
    graph.output.extend(outputs)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
