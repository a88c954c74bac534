"""The base of every loss in :mod:`training.losses`, with the input and hyper-parameter checks they share."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn


class Loss(nn.Module):
    """A scalar batch loss of (logits (N, K), targets (N,)): ``forward`` checks both (:func:`check_inputs`), then
    ``loss`` computes it; the repr shows the hyper-parameters ``params``."""

    name = "loss"
    params: tuple[str, ...] = ()

    def extra_repr(self) -> str:
        return ", ".join(f"{p}={getattr(self, p)!r}" for p in self.params)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, check_inputs(logits, targets, self.name))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of checked inputs (``targets`` int64)."""
        raise NotImplementedError


def check_inputs(logits: torch.Tensor, targets: torch.Tensor, loss_name: str) -> torch.Tensor:
    """``targets`` as int64 after checking float logits (N >= 1, K >= 2) and integer targets (N,) in [0, K)."""
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{loss_name}: logits must be a torch.Tensor, got {type(logits).__name__}")
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"{loss_name}: targets must be a torch.Tensor, got {type(targets).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"{loss_name}: logits must be 2-D with shape (N, K), got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"{loss_name}: logits must be a floating-point tensor, got dtype {logits.dtype}")
    n, k = logits.shape
    if k < 2:
        raise ValueError(f"{loss_name}: logits need at least 2 classes (K >= 2), got K={k}")
    if n < 1:
        raise ValueError(f"{loss_name}: empty batch (N=0); the batch mean is undefined")
    if targets.dim() != 1:
        raise ValueError(f"{loss_name}: targets must be 1-D with shape (N,), got shape {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"{loss_name}: targets must be an integer (class index) tensor, got dtype {targets.dtype}")
    if targets.shape[0] != n:
        raise ValueError(
            f"{loss_name}: logits and targets disagree on the batch size: "
            f"logits has N={n}, targets has {targets.shape[0]}"
        )
    if targets.device != logits.device:
        raise ValueError(f"{loss_name}: logits are on {logits.device} but targets are on {targets.device}")
    t_min = int(targets.min())
    t_max = int(targets.max())
    if t_min < 0 or t_max >= k:
        bad = t_min if t_min < 0 else t_max
        raise ValueError(f"{loss_name}: targets must lie in [0, {k}) for K={k} classes, found {bad}")
    return targets.long()


def check_real(
    loss_name: str,
    param: str,
    value: object,
    *,
    low: float | None = None,
    low_inclusive: bool = True,
    high: float | None = None,
    high_inclusive: bool = True,
) -> float:
    """``value`` as a float after checking it is a finite real number in range; ValueError naming ``param``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{loss_name}: parameter '{param}' must be a real number, got {value!r} ({type(value).__name__})"
        )
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{loss_name}: parameter '{param}' must be finite, got {v}")
    if low is not None and (v < low or (v == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{loss_name}: parameter '{param}' must be {op} {low}, got {v}")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        op = "<=" if high_inclusive else "<"
        raise ValueError(f"{loss_name}: parameter '{param}' must be {op} {high}, got {v}")
    return v
