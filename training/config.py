"""Run configuration: one validated object from a YAML file and command-line overrides.

Unknown keys, unknown model/loss/calibration names and bad values fail before any work starts,
with a message naming the field. ``torchvision:*`` models and ``augment`` need the ``[vision]`` extra;
without it they fail the same way, saying how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from calibkit.calibrators import CALIBRATORS
from training.data import DATASETS, available_corruptions
from training.data.ood import OOD_KINDS
from training.losses import available_losses, loss_parameters
from training.models.registry import check_model_name, is_torchvision


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the problem."""


class RunConfig(BaseModel):
    """Everything a training run needs; defaults are the embedded default job (digits, LeNet-5, CE + T)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset: str = Field(default="digits", description="digits (default, bundled), cifar10 or image_folder")
    data_path: Path | None = Field(default=None, description="local data directory (cifar10, image_folder)")
    classes: list[str] | None = Field(default=None, description="cifar10 subset, e.g. bird,cat")
    image_size: int | None = Field(default=None, ge=8)
    model: str = Field(
        default="lenet5",
        description="lenet5, resnet20, resnet56, resnet110, resnet50, densenet_bc, wrn16_4, wrn28_10, or with the "
        "[vision] extra torchvision:<architecture> (resnet18/34/50/101/152, resnext*, wide_resnet*, "
        "densenet121/161/169/201)",
    )
    weights: Path | None = Field(
        default=None,
        description="torchvision:* models: local state-dict file of pretrained weights (e.g. ImageNet); the "
        "classification layer is replaced; nothing is downloaded",
    )
    finetune: Literal["all", "head"] = Field(
        default="all",
        description="with weights: train all layers (default) or only the new classification layer on the frozen "
        "pretrained features",
    )
    input_size: int | None = Field(
        default=None,
        ge=8,
        description="side length the network sees: images are resized to it (bilinear) inside the exported graph "
        "(e.g. 224 for ImageNet weights); clients still send the data set's size",
    )
    augment: bool = Field(
        default=False,
        description="standard CIFAR augmentation of every training image: random crop of the zero-padded image "
        "(padding image_size / 8) and horizontal flip, from torchvision's transforms ([vision] extra)",
    )
    loss: str = Field(
        default="ce", description="ce, label_smoothing, focal, flsd53, mbls, brier, mmce, entropy_penalty"
    )
    loss_params: dict[str, Any] = {}
    # The default recipe trains to convergence and keeps the final model, without weight decay: the over-confidence
    # of such a network (Guo et al. 2017, their Figure 2) is what post-hoc calibration repairs (decision 0025).
    epochs: int = Field(default=60, ge=1)
    batch_size: int = Field(default=64, ge=1)
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(default=2e-3, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    schedule: Literal["cosine", "step", "constant"] = "cosine"
    milestones: list[float] = Field(
        default=[0.5, 0.75],
        min_length=1,
        description="step schedule: fractions of the epochs after which the learning rate is divided by 10 "
        "(default 0.5,0.75)",
    )
    checkpoint: Literal["last", "best-accuracy", "best-nll"] = Field(
        default="last",
        description="which epoch's weights to keep: last (default: the final epoch, the papers' protocol), "
        "best-accuracy (the highest validation accuracy, ties to the lower validation NLL) or best-nll (the lowest "
        "validation NLL); see docs/training.md",
    )
    train_size: int | None = Field(
        default=None, ge=1, description="train on a stratified subset of this many training images"
    )
    label_noise: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="fraction of the labels of every split changed to another class at random (symmetric noise)",
    )
    seed: int = 0
    calibration: str = Field(
        default="temperature", description="temperature (default), vector, bcts, platt, histogram, isotonic"
    )
    calibration_objective: Literal["nll", "ece"] = Field(
        default="nll", description="nll (default) or ece (a grid search of T)"
    )
    conformal_fraction: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="share of the validation split kept apart (stratified, drawn by the seed) for the conformal "
        "scores written to conformal.json; the calibration is fitted on the rest (default 0.5; 0: no conformal "
        "scores, calibration on all of validation)",
    )
    n_bins: int = Field(default=15, ge=1)
    n_resamples: int = Field(default=1000, ge=10, description="bootstrap resamples on the test split")
    n_resamples_shifted: int = Field(default=200, ge=10, description="bootstrap resamples per corrupted set")
    corruptions: list[str] = Field(default_factory=lambda: list(available_corruptions()))
    severities: list[int] = [1, 2, 3, 4, 5]
    ood: str = "sample_images"
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="artifact name (default <dataset>-<model>[-<loss>])",
    )
    version: str | None = Field(
        default=None, pattern=r"^[0-9]+$", description="artifact version (default: next free number)"
    )

    @model_validator(mode="after")
    def _known_names(self):
        _one_of("dataset", self.dataset, DATASETS)
        try:
            check_model_name(self.model)
        except ValueError as exc:
            raise ValueError(f"model: {exc}") from None
        self._check_fine_tuning()
        _one_of("loss", self.loss, available_losses())
        _one_of("calibration", self.calibration, list(CALIBRATORS))
        _one_of("ood", self.ood, OOD_KINDS)
        for corruption in self.corruptions:
            _one_of("corruptions", corruption, available_corruptions())
        unknown = sorted(set(self.loss_params) - set(loss_parameters(self.loss)))
        if unknown:
            raise ValueError(
                f"loss_params: {', '.join(unknown)} not accepted by loss {self.loss!r} "
                f"(accepted: {', '.join(loss_parameters(self.loss)) or 'none'})"
            )
        if any(not 0 < m < 1 for m in self.milestones) or self.milestones != sorted(set(self.milestones)):
            raise ValueError(f"milestones must be increasing fractions in (0, 1), got {self.milestones}")
        if any(not 1 <= s <= 5 for s in self.severities):
            raise ValueError(f"severities must be in 1..5, got {self.severities}")
        if self.dataset != "digits" and self.data_path is None:
            raise ValueError(f"data_path is required for dataset {self.dataset!r}")
        if self.data_path is not None and not self.data_path.exists():
            raise ValueError(f"data_path {str(self.data_path)!r} does not exist")
        return self

    def _check_fine_tuning(self) -> None:
        if self.weights is not None:
            if not is_torchvision(self.model):
                raise ValueError(
                    f"weights: only torchvision:* models start from a weights file; model is {self.model!r}"
                )
            if not self.weights.is_file():
                raise ValueError(f"weights: {str(self.weights)!r} is not a file")
        if self.finetune == "head" and self.weights is None:
            raise ValueError(
                "finetune: head trains only a new classification layer on pretrained features, so it "
                "needs weights (--weights PATH, a local state-dict file)"
            )
        if self.augment:
            from training.vision import require_torchvision

            try:
                require_torchvision("the standard CIFAR augmentation")
            except ValueError as exc:
                raise ValueError(f"augment: {exc}") from None

    @property
    def model_name(self) -> str:
        """Artifact name: explicit ``name`` or ``<dataset>-<model>[-<loss>]``."""
        if self.name:
            return self.name
        return f"{self.dataset}-{self.model.replace(':', '-')}" + ("" if self.loss == "ce" else f"-{self.loss}")


def _one_of(field: str, value: str, known) -> None:
    if value not in known:
        raise ValueError(f"{field}: unknown {value!r}; known: {', '.join(sorted(known))}")


def load_config(path: str | Path | None = None, defaults: dict[str, Any] | None = None, **overrides: Any) -> RunConfig:
    """A ``RunConfig`` from ``defaults``, an optional YAML file on top, and non-None ``overrides`` on top of both."""
    data: dict[str, Any] = dict(defaults or {})
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of settings")
        data.update(loaded or {})
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None


def _describe(error: ErrorDetails) -> str:
    """``field: message`` for a pydantic error (just the message for whole-config checks)."""
    message = error["msg"].removeprefix("Value error, ")
    location = ".".join(map(str, error["loc"]))
    return f"{location}: {message}" if location else message
