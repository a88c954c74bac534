"""Image classifiers for calibration experiments, built by name via :func:`build_model`."""

from training.models.registry import MODELS, available_models, build_model

__all__ = ["MODELS", "available_models", "build_model"]
