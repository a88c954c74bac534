"""Tests for training.models: shapes, parameter counts, argument checks and ONNX parity."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from training.models import MODELS, available_models, build_model

EXPECTED_NAMES = {
    "lenet5",
    "resnet20",
    "resnet56",
    "resnet110",
    "resnet50",
    "densenet_bc",
    "wrn16_4",
    "wrn28_10",
}


def _count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(x)


def test_registry_lists_every_expected_model() -> None:
    assert set(available_models()) == EXPECTED_NAMES
    assert set(MODELS) == EXPECTED_NAMES
    assert available_models() == sorted(available_models())


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
@pytest.mark.parametrize(("in_channels", "image_size"), [(1, 8), (3, 32)])
def test_forward_shape(name: str, in_channels: int, image_size: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, in_channels=in_channels, image_size=image_size)
    x = torch.randn(2, in_channels, image_size, image_size)
    logits = _forward(model, x)
    assert logits.shape == (2, 10)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert not torch.allclose(logits[0], logits[1])


def test_outputs_are_logits_not_probabilities() -> None:
    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=5, in_channels=3, image_size=32)
    logits = _forward(model, 10 * torch.randn(4, 3, 32, 32))
    assert logits.shape == (4, 5)
    assert not torch.allclose(logits.sum(dim=1), torch.ones(4))


@pytest.mark.parametrize("name", ["resnet20", "densenet_bc", "wrn16_4"])
def test_fully_convolutional_models_accept_other_input_sizes(name: str) -> None:
    model = build_model(name, num_classes=3, in_channels=3, image_size=32)
    assert _forward(model, torch.randn(1, 3, 8, 8)).shape == (1, 3)
    assert _forward(model, torch.randn(1, 3, 40, 24)).shape == (1, 3)


def test_lenet_geometry() -> None:
    classic = build_model("lenet5", num_classes=10, in_channels=1, image_size=32)
    assert _count_parameters(classic) == 61_706
    digits = build_model("lenet5", num_classes=10, in_channels=1, image_size=8)
    assert _forward(digits, torch.randn(3, 1, 8, 8)).shape == (3, 10)


@pytest.mark.parametrize(
    ("name", "expected", "rel_tol"),
    [
        ("resnet20", 270_000, 0.05),
        ("resnet56", 850_000, 0.05),
        ("resnet110", 1_700_000, 0.05),
        ("wrn16_4", 2_700_000, 0.05),
        ("densenet_bc", 176_000, 0.05),
    ],
)
def test_parameter_counts(name: str, expected: int, rel_tol: float) -> None:
    model = build_model(name, num_classes=10, in_channels=3, image_size=32)
    count = _count_parameters(model)
    assert abs(count - expected) <= rel_tol * expected, f"{name}: {count} parameters"


def test_large_model_parameter_counts() -> None:
    assert _count_parameters(build_model("resnet50", num_classes=10, in_channels=3, image_size=32)) == pytest.approx(
        23.5e6, rel=0.02
    )
    assert _count_parameters(build_model("wrn28_10", num_classes=10, in_channels=3, image_size=32)) == pytest.approx(
        36.5e6, rel=0.02
    )


def test_convolutions_are_kaiming_initialised() -> None:
    torch.manual_seed(0)
    model = build_model("resnet56", num_classes=10, in_channels=3, image_size=32)
    conv = model.stages[2][0].conv2
    fan_out = conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]
    assert conv.weight.std().item() == pytest.approx((2.0 / fan_out) ** 0.5, rel=0.05)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)


def test_wide_resnet_dropout_is_configurable() -> None:
    from training.models.wide_resnet import WideResNet

    default = build_model("wrn16_4", num_classes=10, in_channels=3, image_size=32)
    assert not any(isinstance(m, nn.Dropout) for m in default.modules())
    with_dropout = WideResNet(depth=16, widen_factor=4, dropout=0.3, num_classes=10, in_channels=3)
    drops = [m for m in with_dropout.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(m.p == 0.3 for m in drops)


def test_unknown_model_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg16'") as info:
        build_model("vgg16", num_classes=10, in_channels=3, image_size=32)
    for name in EXPECTED_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 1, "in_channels": 3, "image_size": 32}, r"num_classes must be >= 2, got 1"),
        ({"num_classes": 0, "in_channels": 3, "image_size": 32}, r"num_classes must be >= 2, got 0"),
        ({"num_classes": 10, "in_channels": 0, "image_size": 32}, r"in_channels must be >= 1, got 0"),
        ({"num_classes": 10, "in_channels": 3, "image_size": 7}, r"image_size must be >= 8, got 7"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model("resnet20", **kwargs)


def test_non_integer_sizes_are_rejected() -> None:
    with pytest.raises(TypeError, match="num_classes must be an integer"):
        build_model("resnet20", num_classes=10.0, in_channels=3, image_size=32)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="in_channels must be an integer"):
        build_model("resnet20", num_classes=10, in_channels=True, image_size=32)  # type: ignore[arg-type]
    model = build_model("lenet5", num_classes=np.int64(4), in_channels=1, image_size=np.int64(8))
    assert _forward(model, torch.randn(1, 1, 8, 8)).shape == (1, 4)


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning")
@pytest.mark.parametrize(
    ("name", "in_channels", "image_size"),
    [
        ("lenet5", 1, 8),
        ("lenet5", 3, 32),
        ("resnet20", 3, 32),
        ("densenet_bc", 3, 32),
        ("wrn16_4", 1, 8),
    ],
)
def test_onnx_export_matches_torch(tmp_path, name: str, in_channels: int, image_size: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, in_channels=in_channels, image_size=image_size).eval()
    dummy = torch.randn(1, in_channels, image_size, image_size)
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(
        model,
        dummy,
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    batch = torch.randn(5, in_channels, image_size, image_size)
    (onnx_logits,) = session.run(["logits"], {"input": batch.numpy()})
    torch_logits = _forward(model, batch).numpy()
    assert onnx_logits.shape == (5, 10)
    assert np.max(np.abs(onnx_logits - torch_logits)) < 1e-4
