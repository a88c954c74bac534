"""A refused training input names the parameter at fault and the value given."""

import numpy as np
import pytest

from training.data import write_cifar_format


def test_write_cifar_format_names_the_label_outside_the_classes(tmp_path):
    x = np.zeros((4, 32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\); got 7"):
        write_cifar_format(tmp_path / "cifar-10-batches-py", x, [0, 1, 7, 1], ["cat", "dog"], n_train_batches=1)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\); got -1"):
        write_cifar_format(tmp_path / "cifar-10-batches-py", x, [0, -1, 1, 1], ["cat", "dog"], n_train_batches=1)
