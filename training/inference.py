"""Logits from a torch model or an ONNX file, batched, as float64 numpy arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


@torch.no_grad()
def predict_logits(model: nn.Module, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Logits of ``model`` (switched to eval mode) on images ``x`` (N, C, H, W)."""
    model.eval()
    out = [
        model(torch.from_numpy(np.ascontiguousarray(x[i : i + batch_size], dtype=np.float32)))
        for i in range(0, len(x), batch_size)
    ]
    return torch.cat(out).double().numpy()


def onnx_session(model: str | Path | bytes):
    """An onnxruntime CPU session for a model file or its bytes (training-side checks; the service picks providers)."""
    import onnxruntime as ort

    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"])


def onnx_outputs(session, x: np.ndarray, batch_size: int = 512) -> dict[str, np.ndarray]:
    """All outputs of an ONNX classifier on ``x``, concatenated over batches."""
    input_name = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]
    chunks = [
        session.run(names, {input_name: np.ascontiguousarray(x[i : i + batch_size], dtype=np.float32)})
        for i in range(0, len(x), batch_size)
    ]
    return {name: np.concatenate([c[j] for c in chunks]).astype(np.float64) for j, name in enumerate(names)}
