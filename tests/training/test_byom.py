"""Bring your own model: `python -m training calibrate --onnx` turns an ONNX classifier and labelled rows into an
artifact version the service loads as it is, and refuses what it cannot serve with a message naming why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibkit.calibrators import load_calibrator
from calibkit.manifest import load_conformal, load_manifest
from calibkit.temperature import softmax
from service.serving.repository import load_version
from service.settings import BatchingConfig, Settings
from training.byom import calibrate_onnx
from training.cli import main
from training.data import load_dataset

COMMITTED = Path(__file__).resolve().parents[2] / "artifacts" / "digits-lenet5" / "1" / "model.onnx"


@pytest.fixture(scope="module")
def digits_val(tmp_path_factory) -> Path:
    """The digits validation split as a user's labelled rows."""
    splits = load_dataset("digits")
    path = tmp_path_factory.mktemp("data") / "val.npz"
    np.savez(path, x=splits.val.x, y=splits.val.y)
    return path


def linear_graph(path: Path, features: int = 4, classes: int = 3, *, batch="N", dtype=TensorProto.FLOAT, seed=0):
    """scores = x @ W + b over [batch, features]: a tabular classifier's logits under the name ``scores``."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)] if dtype != TensorProto.FLOAT else []
    nodes += [
        helper.make_node("MatMul", ["xf" if nodes else "x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", dtype, [batch, features])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, classes])],
        [
            numpy_helper.from_array(rng.normal(0, 2, (features, classes)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.normal(0, 1, classes).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def tabular_rows(path: Path, graph: Path, n: int = 400, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose labels are drawn from softmax(2 scores): the model is under-confident by a factor 2."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 4)).astype(np.float32)
    z = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    p = softmax(2.0 * z.astype(np.float64))
    y = np.array([rng.choice(p.shape[1], p=row) for row in p])
    np.savez(path, x=x, y=y)
    return x, y


def served(directory: Path):
    """The version as the service loads it (checksums, signature, warm-up, conformal sets)."""
    return load_version(directory, Settings(artifacts=directory.parent.parent), BatchingConfig())


def test_an_image_classifier_becomes_a_version_the_service_loads_as_it_is(tmp_path, digits_val):
    summary = calibrate_onnx(COMMITTED, digits_val, name="mine", artifacts=tmp_path / "artifacts", n_resamples=50)
    directory = tmp_path / "artifacts" / "mine" / "1"
    assert summary["artifact"] == str(directory) and summary["output"] == "logits"
    for name in ("model.onnx", "manifest.json", "conformal.json", "calibration.json", "metrics.json", "report.md"):
        assert (directory / name).is_file(), name
    assert (directory / "plots" / "reliability.png").is_file()
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.input.shape == [None, 1, 8, 8] and manifest.input.name == "input"
    assert manifest.preprocessing is not None and manifest.preprocessing.color_mode == "L"
    assert manifest.class_names == [str(k) for k in range(10)]
    assert len(manifest.reference.confidences) == 359
    assert manifest.conformal is not None and manifest.conformal.calibration_rows == 180
    assert load_conformal(directory, manifest.conformal, manifest.class_names) is not None
    assert manifest.label_shift is not None and manifest.label_shift.n_samples == 359
    assert manifest.label_shift.split == "your data, every row" and len(manifest.label_shift.confusion) == 10
    # the graph's probabilities are calibkit's calibration of the graph's logits
    calibrator = load_calibrator(directory / "calibration.json")
    x = load_dataset("digits").test.x
    logits, probs = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        ["logits", "probabilities"], {"input": x}
    )
    np.testing.assert_allclose(probs, calibrator.transform(logits.astype(np.float64)), atol=1e-6)
    report = (directory / "report.md").read_text()
    assert "## Held-out rows" in report and "plots/reliability.png" in report
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics["rows"] == {"fitted": 179, "held_out": 180, "seed": 0, "fraction": 0.5}
    lo, hi = metrics["test"]["after"]["ece"]["ci"]
    assert lo <= hi
    model = served(directory)
    assert model.shape == (1, 8, 8) and model.sets.describe()["available"]
    # the next call writes the next version; a taken one is refused unless overwritten
    calibrate_onnx(COMMITTED, digits_val, name="mine", artifacts=tmp_path / "artifacts", n_resamples=20)
    assert (tmp_path / "artifacts" / "mine" / "2" / "manifest.json").is_file()
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        calibrate_onnx(COMMITTED, digits_val, name="mine", artifacts=tmp_path / "artifacts", version="2")


def test_a_probability_output_is_calibrated_through_its_log_and_must_be_flagged(tmp_path, digits_val):
    kwargs = {"name": "p", "artifacts": tmp_path, "output_name": "probabilities", "n_resamples": 20}
    with pytest.raises(ValueError, match="holds probabilities .* pass --probabilities"):
        calibrate_onnx(COMMITTED, digits_val, **kwargs)
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())
    summary = calibrate_onnx(COMMITTED, digits_val, probabilities=True, **kwargs)
    assert summary["max_abs_diff_probabilities"] < 1e-5
    manifest = load_manifest(Path(summary["artifact"]) / "manifest.json")
    assert manifest.training["output_holds"] == "probabilities"
    with pytest.raises(ValueError, match="rows sum to .* drop --probabilities"):
        calibrate_onnx(COMMITTED, digits_val, name="q", artifacts=tmp_path, output_name="logits", probabilities=True)


def test_a_feature_vector_model_with_vector_scaling_is_served_numbers_only(tmp_path):
    graph = linear_graph(tmp_path / "linear.onnx")
    x, y = tabular_rows(tmp_path / "rows.npz", graph)
    (tmp_path / "classes.txt").write_text("low\nmid\nhigh\n")
    summary = calibrate_onnx(
        graph,
        tmp_path / "rows.npz",
        name="tabular",
        artifacts=tmp_path / "artifacts",
        class_names=tmp_path / "classes.txt",
        method="vector",
        n_resamples=20,
    )
    assert summary["output"] == "scores" and summary["max_abs_diff_probabilities"] < 1e-5
    directory = Path(summary["artifact"])
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.input.shape == [None, 4] and manifest.input.name == "x" and manifest.preprocessing is None
    assert manifest.class_names == ["low", "mid", "high"] and manifest.calibration.method == "vector"
    calibrator = load_calibrator(directory / "calibration.json")
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, probs = session.run(["logits", "probabilities"], {"x": x})
    np.testing.assert_allclose(probs, calibrator.transform(logits.astype(np.float64)), atol=1e-6)
    assert [o.name for o in session.get_outputs()] == ["logits", "probabilities"]
    assert served(directory).shape == (4,)
    # labels given as class names
    np.savez(tmp_path / "named.npz", x=x, y=np.array(["low", "mid", "high"])[y])
    again = calibrate_onnx(
        graph,
        tmp_path / "named.npz",
        name="tabular",
        artifacts=tmp_path / "artifacts",
        class_names=tmp_path / "classes.txt",
    )
    assert again["calibration"]["method"] == "temperature"
    assert again["calibration"]["params"]["temperature"] == pytest.approx(0.5, rel=0.25)


def test_bias_corrected_temperature_scaling_is_baked_into_the_graph(tmp_path):
    graph = linear_graph(tmp_path / "linear.onnx")
    x, _ = tabular_rows(tmp_path / "rows.npz", graph)
    summary = calibrate_onnx(graph, tmp_path / "rows.npz", name="t", artifacts=tmp_path, method="bcts", n_resamples=20)
    assert summary["calibration"]["method"] == "bcts" and summary["max_abs_diff_probabilities"] < 1e-5
    assert summary["calibration"]["params"]["temperature"] == pytest.approx(0.5, rel=0.25)
    directory = Path(summary["artifact"])
    assert load_manifest(directory / "manifest.json").calibration.method == "bcts"
    calibrator = load_calibrator(directory / "calibration.json")
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, probs = session.run(["logits", "probabilities"], {"x": x})
    np.testing.assert_allclose(probs, calibrator.transform(logits.astype(np.float64)), atol=1e-6)


def test_a_skl2onnx_classifier_with_its_default_zipmap_is_accepted(tmp_path):
    from skl2onnx import to_onnx
    from sklearn.datasets import load_wine
    from sklearn.linear_model import LogisticRegression

    x, y = load_wine(return_X_y=True)
    x = x.astype(np.float32)
    model = LogisticRegression(max_iter=5000).fit(x[::2], y[::2])
    onnx_model = to_onnx(model, x[:1], target_opset=17)
    assert "ZipMap" in [node.op_type for node in onnx_model.graph.node]
    (tmp_path / "wine.onnx").write_bytes(onnx_model.SerializeToString())
    rows = np.r_[1 : len(y) : 2]
    np.savez(tmp_path / "wine.npz", x=x[rows], y=y[rows])
    summary = calibrate_onnx(tmp_path / "wine.onnx", tmp_path / "wine.npz", artifacts=tmp_path / "a", n_resamples=20)
    directory = Path(summary["artifact"])
    assert directory == tmp_path / "a" / "wine" / "1" and summary["output"].endswith("(behind a ZipMap)")
    graph = onnx.load(str(directory / "model.onnx")).graph
    assert "ZipMap" not in [node.op_type for node in graph.node]
    temperature = load_manifest(directory / "manifest.json").calibration.temperature
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    probs = session.run(["probabilities"], {"X": x})[0]
    own = softmax(np.log(np.clip(model.predict_proba(x), 1e-30, 1)) / temperature)
    np.testing.assert_allclose(probs, own, atol=1e-4)
    assert served(directory).shape == (13,)


def _graph(tmp_path: Path, **kwargs) -> Path:
    return linear_graph(tmp_path / "g.onnx", **kwargs)


def _label_only(tmp_path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0)],
        "labels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "label.onnx"))
    return tmp_path / "label.onnx"


def _rows(tmp_path: Path, x=None, y=None, n: int = 400) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (n, 4)).astype(np.float32) if x is None else x
    y = rng.integers(0, 3, n) if y is None else y
    np.savez(tmp_path / "rows.npz", x=x, y=y)
    return tmp_path / "rows.npz"


REFUSED = {
    "no classifier output": (lambda t: (_label_only(t), _rows(t)), {}, "the graph has no classifier output"),
    "an integer input": (
        lambda t: (_graph(t, dtype=TensorProto.INT64), _rows(t)),
        {},
        "input 'x' is INT64; the service sends float32",
    ),
    "a fixed batch axis": (lambda t: (_graph(t, batch=1), _rows(t)), {}, "has a fixed batch axis of 1"),
    "rows of another width": (
        lambda t: (_graph(t), _rows(t, x=np.zeros((400, 5), np.float32))),
        {},
        r"x has rows of shape \[5\]; the model's input 'x' takes \[N, 4\]",
    ),
    "labels of another count": (
        lambda t: (_graph(t), _rows(t, y=np.zeros(399, int))),
        {},
        r"x has 400 rows but y has shape \[399\]",
    ),
    "a label outside the classes": (
        lambda t: (_graph(t), _rows(t, y=np.full(400, 3))),
        {},
        r"y holds label 3, outside the model's 3 classes \[0, 2\]",
    ),
    "too few rows for the conformal scores": (
        lambda t: (_graph(t), _rows(t, n=36)),
        {},
        "leave 18 for the conformal scores; at least 20 are needed",
    ),
    "a method without an ONNX form": (
        lambda t: (_graph(t), _rows(t)),
        {"method": "isotonic"},
        "--method 'isotonic' cannot be baked into the ONNX graph",
    ),
    "an unknown output": (lambda t: (_graph(t), _rows(t)), {"output_name": "logits"}, "--output-name 'logits' is not"),
    "class names of another count": (
        lambda t: (_graph(t), _rows(t)),
        {"class_names": "names"},
        "names 2 classes but the model outputs 3",
    ),
    "a name the repository cannot hold": (lambda t: (_graph(t), _rows(t)), {"name": "../x"}, "--name '../x'"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_what_cannot_be_served_is_refused_naming_why_and_leaves_no_version(tmp_path, case):
    build, options, message = REFUSED[case]
    graph, rows = build(tmp_path)
    if options.get("class_names") == "names":
        (tmp_path / "names.txt").write_text("a\nb\n")
        options = options | {"class_names": tmp_path / "names.txt"}
    with pytest.raises(ValueError, match=message):
        calibrate_onnx(graph, rows, artifacts=tmp_path / "artifacts", n_resamples=10, **options)
    assert not list((tmp_path / "artifacts").glob("*/*")), "a refused call leaves no version folder"


def test_the_command_prints_its_summary_and_names_bad_input_in_one_line(tmp_path, capsys):
    graph = _graph(tmp_path)
    rows = _rows(tmp_path)
    argv = ["calibrate", "--onnx", str(graph), "--data", str(rows), "--name", "t", "--artifacts", str(tmp_path / "a")]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["artifact"] == str(tmp_path / "a" / "t" / "1")
    assert main([*argv, "--version", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pass --overwrite" in err and "Traceback" not in err
