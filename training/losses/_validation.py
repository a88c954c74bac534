"""Input and hyper-parameter checks shared by every loss in :mod:`training.losses`."""

from __future__ import annotations

import math
import numbers

import torch


def check_inputs(logits: torch.Tensor, targets: torch.Tensor, loss_name: str) -> torch.Tensor:
    """Validate a ``(logits, targets)`` pair and return ``targets`` as an int64 tensor.

    Requirements: ``logits`` is a floating-point tensor of shape ``(N, K)`` with
    ``N >= 1`` and ``K >= 2``; ``targets`` is a 1-D integer tensor of length ``N``
    whose values lie in ``[0, K)``. Anything else raises :class:`ValueError`.
    """
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
    """Return ``value`` as a float after checking it is a finite real number in range.

    Raises :class:`ValueError` naming the parameter and the problem otherwise.
    """
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
