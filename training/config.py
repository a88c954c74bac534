"""Run configuration: one validated object from a YAML file and command-line overrides.

Unknown keys, unknown model/loss/calibration names and bad values fail before any work starts,
with a message naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from calibkit.calibrators import CALIBRATORS
from training.data import DATASETS, available_corruptions
from training.data.ood import OOD_KINDS
from training.losses import available_losses, loss_parameters
from training.models import available_models


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the problem."""


class RunConfig(BaseModel):
    """Everything a training run needs; defaults are the embedded default job (digits, LeNet-5, CE + T)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset: str = "digits"
    data_path: Path | None = None
    classes: list[str] | None = None
    image_size: int | None = Field(default=None, ge=8)
    model: str = "lenet5"
    loss: str = "ce"
    loss_params: dict[str, Any] = {}
    epochs: int = Field(default=30, ge=1)
    batch_size: int = Field(default=64, ge=1)
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(default=2e-3, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=5e-4, ge=0)
    schedule: Literal["cosine", "step", "constant"] = "cosine"
    milestones: list[float] = Field(default=[0.5, 0.75], min_length=1, description="step schedule: fractions of "
                                    "the epochs after which the learning rate is divided by 10")
    checkpoint: Literal["last", "best-accuracy", "best-nll"] = Field(
        default="best-accuracy", description="which epoch's weights a run keeps; see docs/training.md")
    train_size: int | None = Field(default=None, ge=1, description="stratified subset of the training split")
    label_noise: float = Field(default=0.0, ge=0, lt=1, description="fraction of the labels of every split "
                               "changed to another class at random (symmetric noise)")
    seed: int = 0
    calibration: str = "temperature"
    calibration_objective: Literal["nll", "ece"] = "nll"
    n_bins: int = Field(default=15, ge=1)
    n_resamples: int = Field(default=1000, ge=10, description="bootstrap resamples on the test split")
    n_resamples_shifted: int = Field(default=200, ge=10, description="bootstrap resamples per corrupted set")
    corruptions: list[str] = Field(default_factory=lambda: list(available_corruptions()))
    severities: list[int] = [1, 2, 3, 4, 5]
    ood: str = "sample_images"
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str | None = Field(default=None, pattern=r"^[0-9]+$")

    @model_validator(mode="after")
    def _known_names(self):
        _one_of("dataset", self.dataset, DATASETS)
        _one_of("model", self.model, available_models())
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

    @property
    def model_name(self) -> str:
        """Artifact name: explicit ``name`` or ``<dataset>-<model>[-<loss>]``."""
        if self.name:
            return self.name
        return f"{self.dataset}-{self.model}" + ("" if self.loss == "ce" else f"-{self.loss}")


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


def _describe(error: dict) -> str:
    """``field: message`` for a pydantic error (just the message for whole-config checks)."""
    message = error["msg"].removeprefix("Value error, ")
    location = ".".join(map(str, error["loc"]))
    return f"{location}: {message}" if location else message
