"""An untrained network exported like any trained model: the heavy model of the serving benchmarks and the GPU runs
(weights do not change speed), and of the tests that serve a large graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def untrained_artifact(
    root: Path,
    name: str,
    architecture: str = "resnet56",
    input_shape: tuple[int, int, int] = (3, 32, 32),
    classes: int = 10,
) -> Path:
    """Version 1 of ``name`` under ``root``: ``architecture`` with weights seeded at 0, temperature-scaled on 64
    random inputs, written by ``training.export.write_artifact``; its version folder. Seeded, because an unseeded
    draw sometimes has logits in the tens of thousands, past the export's parity bound on the probabilities."""
    import torch

    from calibkit.calibrators import TemperatureScaling
    from training.data import DataSplits, ImageDataset
    from training.evaluation import before_after
    from training.export import write_artifact
    from training.inference import predict_logits
    from training.models.network import ModelSpec

    rng = np.random.default_rng(0)
    names = tuple(f"class{i}" for i in range(classes))

    def part(n: int) -> ImageDataset:
        return ImageDataset(rng.random((n, *input_shape), dtype=np.float32), np.arange(n) % classes, names)

    splits = DataSplits(part(64), part(64), part(64), "random")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ModelSpec.for_data(architecture, splits).build().eval()
    logits = predict_logits(model, splits.val.x)
    calibrator = TemperatureScaling().fit(logits, splits.val.y)
    write_artifact(
        model=model,
        calibrator=calibrator,
        class_names=names,
        input_shape=input_shape,
        val_x=splits.val.x,
        val_y=splits.val.y,
        evaluation={"validation": before_after(logits, splits.val.y, calibrator, 20, 15)},
        training_info=None,
        root=root,
        name=name,
        version="1",
    )
    return root / name / "1"
