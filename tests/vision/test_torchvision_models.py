"""torchvision:* models: which architectures, pretrained weights from a local file (all but the classification
layer), the clear errors of a file that does not fit, head-only and full fine-tuning, grey images."""

import numpy as np
import pytest
import torch
import torchvision

from calibkit.manifest import load_manifest
from training import pipeline
from training.config import ConfigError, load_config
from training.models.network import IMAGENET_MEAN, InputAdapter, ModelSpec, classifier_of
from training.trainer import seed_everything, train
from training.vision.models import check_architecture, freeze_all_but_head, load_pretrained, supported_architectures

FAST = {
    "epochs": 1,
    "n_resamples": 20,
    "n_resamples_shifted": 10,
    "corruptions": ["contrast"],
    "severities": [3],
    "batch_size": 32,
}


def _cifar(cifar_root, **overrides):
    return load_config(dataset="cifar10", data_path=cifar_root, classes=["bird", "cat"], **(FAST | overrides))


def test_the_supported_architectures_are_torchvision_resnets_and_densenets():
    supported = supported_architectures()
    assert {"resnet18", "resnet50", "densenet121", "resnext50_32x4d", "wide_resnet50_2"} <= set(supported)
    assert all(a.startswith(("resnet", "resnext", "wide_resnet", "densenet")) for a in supported)
    with pytest.raises(ValueError, match="unknown torchvision architecture 'vgg16'; supported: densenet121"):
        check_architecture("vgg16")
    with pytest.raises(ConfigError, match="model: unknown torchvision architecture 'alexnet'"):
        load_config(model="torchvision:alexnet")


@pytest.mark.parametrize("architecture, head", [("resnet18", "fc"), ("densenet121", "classifier")])
def test_pretrained_weights_load_into_everything_but_the_classification_layer(weights_file, architecture, head):
    path = weights_file(architecture)
    saved = torch.load(path, weights_only=True)
    spec = ModelSpec(f"torchvision:{architecture}", 2, 3, 32, ("bird", "cat"), IMAGENET_MEAN, (0.2, 0.2, 0.2))
    net = classifier_of(spec.build())
    load_pretrained(net, architecture, path)
    loaded = net.state_dict()
    assert set(loaded) == set(saved)
    for key, tensor in saved.items():
        if key.startswith(head + "."):
            assert tensor.shape[0] == 1000 and loaded[key].shape[0] == 2, key
        else:
            assert torch.equal(loaded[key], tensor), key


def test_densenet_files_with_torchvision_s_published_parameter_names_load(weights_file, tmp_path):
    """torchvision's published DenseNet files name ``denselayer1.norm.1.weight`` what the module calls
    ``denselayer1.norm1.weight``, and have no batch-norm batch counters."""
    saved = torch.load(weights_file("densenet121"), weights_only=True)
    legacy = {
        k.replace(".norm1.", ".norm.1.").replace(".conv2.", ".conv.2."): v
        for k, v in saved.items()
        if not k.endswith("num_batches_tracked")
    }  # nor did PyTorch save batch counters before 0.4.1
    assert any(".norm.1." in k for k in legacy)
    torch.save(legacy, tmp_path / "legacy.pth")
    net = torchvision.models.densenet121(num_classes=2)
    load_pretrained(net, "densenet121", tmp_path / "legacy.pth")
    assert torch.equal(
        net.state_dict()["features.denseblock1.denselayer1.norm1.running_var"],
        saved["features.denseblock1.denselayer1.norm1.running_var"],
    )


def test_a_weights_file_that_does_not_fit_is_a_clear_error(weights_file, tmp_path):
    net = torchvision.models.resnet50(num_classes=2)
    with pytest.raises(
        ValueError,
        match=r"weights: .*resnet18-imagenet.pth does not fit torchvision:resnet50: "
        r"\d+ missing tensors \['layer1.0.bn3.bias'",
    ):
        load_pretrained(net, "resnet50", weights_file("resnet18"))
    torch.save(torchvision.models.resnet18(), tmp_path / "pickled-model.pth")
    with pytest.raises(ValueError, match="weights: .*pickled-model.pth is not a file torch can load as plain tensors"):
        load_pretrained(net, "resnet50", tmp_path / "pickled-model.pth")
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    with pytest.raises(ValueError, match=r"holds a list, not a state dict"):
        load_pretrained(net, "resnet50", tmp_path / "list.pth")
    state = torchvision.models.resnet50().state_dict()
    state["conv1.weight"] = torch.zeros(64, 3, 5, 5)
    torch.save(state, tmp_path / "odd.pth")
    with pytest.raises(
        ValueError,
        match=r"1 tensors of another shape, e.g. conv1.weight \(64, 3, 5, 5\) "
        r"\(expected \(64, 3, 7, 7\)\)",
    ):
        load_pretrained(net, "resnet50", tmp_path / "odd.pth")
    with pytest.raises(ConfigError, match="weights: '/nonexistent.pth' is not a file"):
        load_config(model="torchvision:resnet18", weights="/nonexistent.pth")


def test_head_fine_tuning_trains_only_the_new_classification_layer(weights_file, cifar_root):
    path = weights_file("resnet18")
    saved = torch.load(path, weights_only=True)
    config = _cifar(cifar_root, model="torchvision:resnet18", weights=path, finetune="head", lr=0.05)
    result = train(config, pipeline.load_splits(config), progress=False)
    trained = classifier_of(result.model).state_dict()
    for key, tensor in saved.items():
        if not key.startswith("fc."):  # weights and batch-norm statistics alike stay pretrained
            assert torch.equal(trained[key], tensor), key
    assert trained["fc.weight"].shape == (2, 512)
    seed_everything(config.seed)  # the head as training drew it, before it was trained
    initial = classifier_of(result.spec.build()).state_dict()
    assert not torch.equal(trained["fc.weight"], initial["fc.weight"])
    assert freeze_all_but_head(classifier_of(result.model), "resnet18") == 512 * 2 + 2


def test_full_fine_tuning_starts_from_the_weights_and_trains_every_layer(weights_file, cifar_root):
    path = weights_file("resnet18")
    saved = torch.load(path, weights_only=True)
    config = _cifar(cifar_root, model="torchvision:resnet18", weights=path, lr=1e-4, optimizer="sgd")
    trained = classifier_of(train(config, pipeline.load_splits(config), progress=False).model).state_dict()
    fresh = torchvision.models.resnet18(num_classes=2).state_dict()
    step = (trained["conv1.weight"] - saved["conv1.weight"]).abs().max().item()
    assert 0 < step < 1e-3 < (fresh["conv1.weight"] - saved["conv1.weight"]).abs().max().item()
    assert not torch.equal(trained["bn1.running_mean"], saved["bn1.running_mean"])


def test_grey_digits_on_a_torchvision_model_export_with_the_channel_repeat_and_resize_in_the_graph(tmp_path):
    config = load_config(**(FAST | {"batch_size": 128}), model="torchvision:resnet18", input_size=32)
    out = pipeline.run(config, tmp_path / "run", tmp_path / "artifacts", progress=False)
    result, _ = pipeline.load_checkpoint(tmp_path / "run" / pipeline.CHECKPOINT)
    adapter = result.model[0]
    assert isinstance(adapter, InputAdapter) and (adapter.channels, adapter.size) == (3, 32)
    assert result.spec.mean == IMAGENET_MEAN
    manifest = load_manifest(tmp_path / "artifacts" / "digits-torchvision-resnet18" / "1" / "manifest.json")
    assert manifest.input.shape == [None, 1, 8, 8] and manifest.preprocessing.color_mode == "L"
    assert out["parity"]["max_abs_diff_probabilities"] < 1e-5
    assert np.isfinite(out["evaluation"]["test"]["after"]["ece"]["value"])


def test_a_densenet_on_images_too_small_for_it_says_to_resize(tmp_path, capsys):
    from training.cli import main

    assert main(["train", "--model", "torchvision:densenet121", "--epochs", "1", "--run-dir", str(tmp_path)]) == 2
    assert (
        "torchvision:densenet121 needs images of at least 32x32, got 8x8; set input_size (--input-size)"
        in capsys.readouterr().err
    )
