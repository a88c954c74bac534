"""The core install without torchvision: only training/vision imports it, everything else imports and runs without
it, and asking for what needs it fails before any work, naming the field and the extra. Also the settings that
fine-tuning adds, and ``input_size`` on the core models (it needs no torchvision)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calibkit.manifest import load_manifest
from training import pipeline
from training.cli import main
from training.config import ConfigError, load_config
from training.models.network import InputAdapter, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
FAST = {"epochs": 1, "n_resamples": 20, "n_resamples_shifted": 10, "corruptions": ["contrast"], "severities": [3]}


def _imports_torchvision(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torchvision" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchvision":
            return True
    return False


def test_only_the_vision_package_imports_torchvision():
    sources = [
        p for d in ("calibkit", "training", "service", "bench", "scripts", "examples") for p in (ROOT / d).rglob("*.py")
    ]
    importers = {p.relative_to(ROOT).as_posix() for p in sources if _imports_torchvision(p)}
    assert importers == {"training/vision/__init__.py", "training/vision/augmentation.py"}


def test_the_core_imports_and_configures_with_torchvision_unimportable():
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['torchvision'] = None\n"
        "import training, service\n"
        "names = [m.name for p in (training, service) for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "for name in names:\n"
        "    if not name.endswith('.__main__'):\n"
        "        importlib.import_module(name)\n"
        "from training.config import load_config\n"
        "load_config()\n"
        "print(len(names), sys.modules['torchvision'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    count, module = out.stdout.split()
    assert int(count) > 40 and module == "None"


@pytest.fixture
def no_torchvision(monkeypatch):
    """torchvision unimportable, as in the core venv (and in the torchvision venv, to test the same path there)."""
    monkeypatch.setitem(sys.modules, "torchvision", None)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"model": "torchvision:resnet50"},
            "model: torchvision:resnet50 needs the optional [vision] extra: torch 2.14.1 + torchvision 0.29.1",
        ),
        ({"augment": True}, "augment: the standard CIFAR augmentation needs the optional [vision] extra"),
    ],
)
def test_what_needs_torchvision_fails_before_any_work_naming_the_extra(no_torchvision, overrides, message):
    with pytest.raises(ConfigError, match="make vision; README, 'Torchvision models'") as error:
        load_config(**overrides)
    assert message in str(error.value)


def test_the_cli_says_the_same_in_one_line_with_exit_status_2(no_torchvision, capsys):
    assert main(["train", "--model", "torchvision:densenet121"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: invalid configuration: model: torchvision:densenet121 needs the optional [vision]")
    assert "\n" not in err


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"weights": "WEIGHTS"}, "weights: only torchvision:* models start from a weights file; model is 'lenet5'"),
        (
            {"finetune": "head"},
            "finetune: head trains only a new classification layer on pretrained features, so it needs weights",
        ),
        ({"finetune": "some"}, "finetune: Input should be 'all' or 'head'"),
        ({"input_size": 4}, "input_size: Input should be greater than or equal to 8"),
        ({"model": "torchvision"}, "model: unknown 'torchvision'; known: densenet_bc"),
    ],
)
def test_fine_tuning_settings_are_checked_before_any_work(tmp_path, overrides, message):
    weights = tmp_path / "weights.pt"
    weights.write_bytes(b"")
    overrides = {k: weights if v == "WEIGHTS" else v for k, v in overrides.items()}
    with pytest.raises(ConfigError) as error:
        load_config(**overrides)
    assert message in str(error.value)


def test_the_default_network_is_unchanged_by_the_adapter():
    splits = pipeline.load_splits(load_config())
    network = ModelSpec.for_data("lenet5", splits).build()
    assert not any(isinstance(m, InputAdapter) for m in network)
    assert [k for k in network.state_dict() if k.startswith("0.")] == ["0.mean", "0.std"]


def test_input_size_resizes_inside_the_exported_graph(tmp_path):
    """A core model trained at 16x16 on the 8x8 digits: the artifact still takes 8x8 images, and onnxruntime
    agrees with torch (the export's parity check) through the resize."""
    config = load_config(**FAST, input_size=16)
    out = pipeline.run(config, tmp_path / "run", tmp_path / "artifacts", progress=False)
    result, _ = pipeline.load_checkpoint(tmp_path / "run" / pipeline.CHECKPOINT)
    adapter = result.model[0]
    assert isinstance(adapter, InputAdapter) and (adapter.channels, adapter.size) == (None, 16)
    assert result.spec.input_size == 16
    assert load_manifest(Path(out["artifact"]) / "manifest.json").input.shape == [None, 1, 8, 8]
    assert out["parity"]["max_abs_diff_probabilities"] < 1e-5
    x = torch.from_numpy(pipeline.load_splits(config).test.x[:4])
    with torch.no_grad():
        assert result.model[:2](x).shape == (4, 1, 16, 16)
        assert result.model[-1](result.model[:2](x)).shape == (4, 10)
