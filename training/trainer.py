"""The training loop: seeded, deterministic on a given machine; the checkpoint policy picks the kept epoch.

A ``torchvision:*`` model can start from a local weights file and fine-tune all its layers or only a new
classification layer (``finetune``); ``augment`` draws the standard CIFAR augmentation per training image.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from calibkit import metrics
from calibkit.temperature import softmax
from training.config import RunConfig
from training.data import DataSplits
from training.inference import predict_logits
from training.losses import build_loss
from training.models.network import ModelSpec, classifier_of
from training.models.registry import TORCHVISION_PREFIX

#: Checkpoint policies: the key each maximises over the per-epoch history (ties: the earliest epoch). ``last`` keeps
#: the final epoch, the protocol of Guo et al. 2017 and Mukhoti et al. 2020 (full schedule, final model);
#: ``best-accuracy`` the highest validation accuracy (ties: the lower validation NLL); ``best-nll`` the lowest NLL.
CHECKPOINT_KEYS = {
    "last": lambda row: (row["epoch"],),
    "best-accuracy": lambda row: (row["val_accuracy"], -row["val_nll"]),
    "best-nll": lambda row: (-row["val_nll"],),
}


def select_epoch(history: list[dict], policy: str) -> int:
    """The epoch (1-based) that ``policy`` keeps: argmax over ``history`` of ``CHECKPOINT_KEYS[policy]``.

    >>> history = [{"epoch": 1, "val_accuracy": 0.9, "val_nll": 0.4}, {"epoch": 2, "val_accuracy": 0.9, "val_nll": 0.3},
    ...            {"epoch": 3, "val_accuracy": 0.8, "val_nll": 0.2}, {"epoch": 4, "val_accuracy": 0.7, "val_nll": 0.5}]
    >>> [select_epoch(history, p) for p in ("last", "best-accuracy", "best-nll")]
    [4, 2, 3]
    """
    if policy not in CHECKPOINT_KEYS:
        raise ValueError(f"checkpoint policy must be one of {', '.join(CHECKPOINT_KEYS)}, got {policy!r}")
    if not history:
        raise ValueError("no epochs in the history to select from")
    return max(history, key=CHECKPOINT_KEYS[policy])["epoch"]


@dataclass
class TrainResult:
    """The kept model (loaded, eval mode), its spec, the per-epoch history and the epoch the checkpoint policy kept."""

    model: nn.Module
    spec: ModelSpec
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    seconds: float = 0.0


def seed_everything(seed: int) -> None:
    """Seed torch and numpy and ask torch for deterministic kernels."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _optimizer(config: RunConfig, params) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def _scheduler(config: RunConfig, optimizer):
    if config.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs)
    if config.schedule == "step":
        milestones = [int(config.epochs * m) for m in config.milestones]
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def train(config: RunConfig, splits: DataSplits, *, progress: bool = True) -> TrainResult:
    """Train ``config.model`` with ``config.loss``; keep the epoch ``config.checkpoint`` selects."""
    seed_everything(config.seed)
    spec = ModelSpec.for_data(config.model, splits, input_size=config.input_size)
    model = spec.build()
    if config.weights is not None:  # a torchvision:* classifier: its classification layer stays new
        from training.vision.models import freeze_all_but_head, load_pretrained

        net, architecture = classifier_of(model), config.model.removeprefix(TORCHVISION_PREFIX)
        load_pretrained(net, architecture, config.weights)
        if config.finetune == "head":
            freeze_all_but_head(net, architecture)
    augment = None
    if config.augment:
        from training.vision.augmentation import cifar_augmentation

        augment = cifar_augmentation(spec.image_size)
    loss_fn = build_loss(config.loss, **config.loss_params)
    optimizer = _optimizer(config, [p for p in model.parameters() if p.requires_grad])
    scheduler = _scheduler(config, optimizer)
    generator = torch.Generator().manual_seed(config.seed)
    x_train, y_train = torch.from_numpy(splits.train.x), torch.from_numpy(splits.train.y)
    n = len(y_train)

    result = TrainResult(model=model, spec=spec)
    kept_state = None
    start = time.perf_counter()
    bar = tqdm(
        range(1, config.epochs + 1),
        desc=f"train {config.model_name}",
        disable=not progress,
        unit="epoch",
        mininterval=1.0,
    )
    for epoch in bar:
        # head-only fine-tuning keeps the frozen layers in eval mode: their batch-norm statistics stay pretrained
        model.train(config.finetune == "all")
        total_loss, total_correct = 0.0, 0
        for idx in torch.randperm(n, generator=generator).split(config.batch_size):
            logits = model(x_train[idx] if augment is None else augment(x_train[idx]))
            loss = loss_fn(logits, y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(idx)
            total_correct += int((logits.argmax(1) == y_train[idx]).sum())
        scheduler.step()
        val_probs = softmax(predict_logits(model, splits.val.x))
        row = {
            "epoch": epoch,
            "lr": optimizer.param_groups[0]["lr"],
            "train_loss": total_loss / n,
            "train_accuracy": total_correct / n,
            "val_accuracy": metrics.accuracy(val_probs, splits.val.y),
            "val_nll": metrics.nll(val_probs, splits.val.y),
            "val_ece": metrics.ece(val_probs, splits.val.y, config.n_bins),
        }
        result.history.append(row)
        if config.checkpoint != "last" and select_epoch(result.history, config.checkpoint) == epoch:
            kept_state = copy.deepcopy(model.state_dict())
        bar.set_postfix(
            loss=f"{row['train_loss']:.3f}",
            acc=f"{row['train_accuracy']:.3f}",
            val_acc=f"{row['val_accuracy']:.3f}",
            val_ece=f"{row['val_ece']:.3f}",
        )
    result.best_epoch = select_epoch(result.history, config.checkpoint)
    if kept_state is not None:
        model.load_state_dict(kept_state)
    model.eval()
    result.seconds = time.perf_counter() - start
    return result


def save_checkpoint(result: TrainResult, config: RunConfig, path: Path) -> None:
    """The kept weights, the model spec, the config and the history in one file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": result.model.state_dict(),
            "spec": result.spec.__dict__,
            "config": config.model_dump(mode="json"),
            "history": result.history,
            "best_epoch": result.best_epoch,
            "seconds": result.seconds,
        },
        path,
    )


def load_checkpoint(path: Path) -> tuple[TrainResult, RunConfig]:
    """Inverse of ``save_checkpoint``."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: run `python -m training train` first")
    data = torch.load(path, map_location="cpu", weights_only=True)
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data["spec"].items()}
    spec = ModelSpec(**fields)
    model = spec.build()
    model.load_state_dict(data["state_dict"])
    model.eval()
    result = TrainResult(model, spec, data["history"], data["best_epoch"], data["seconds"])
    return result, RunConfig.model_validate(data["config"])
