"""Fixtures of the torchvision tests (``make test-vision``): a small generated CIFAR-10 file and "pretrained"
weights files, which are randomly initialised torchvision classifiers saved as state dicts, as a user saves
the ImageNet ones."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory) -> Path:
    """A directory holding cifar-10-batches-py in the real format: 288 bird and cat images (240 train, 48 test);
    birds are darker in the red channel, so there is something to learn."""
    root = tmp_path_factory.mktemp("cifar")
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat([2, 3], 144))
    images = rng.integers(0, 256, size=(len(labels), 32, 32, 3), dtype=np.uint8)
    images[labels == 2, :, :, 0] //= 3
    from training.data import write_cifar_format

    write_cifar_format(root / "cifar-10-batches-py", images, labels, CIFAR_NAMES)
    return root


@pytest.fixture(scope="session")
def weights_file(tmp_path_factory):
    """``weights_file(architecture)``: the path of a state-dict file of a randomly initialised torchvision
    ``architecture`` with ImageNet's 1000-class head (made once per architecture)."""
    root, made = tmp_path_factory.mktemp("weights"), {}

    def make(architecture: str) -> Path:
        if architecture not in made:
            torch.manual_seed(1234)
            net = torchvision.models.get_model(architecture, weights=None)
            with torch.no_grad():  # batch-norm statistics unlike a fresh network's, as trained ones are
                for name, buffer in net.named_buffers():
                    if name.endswith("running_mean"):
                        buffer.normal_(0.0, 0.1)
                    elif name.endswith("running_var"):
                        buffer.uniform_(0.5, 1.5)
            made[architecture] = root / f"{architecture}-imagenet.pth"
            torch.save(net.state_dict(), made[architecture])
        return made[architecture]

    return make
