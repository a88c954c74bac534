"""HTTP service that serves calibrated probabilities from ONNX models and reports their calibration."""

__version__ = "0.1.0"
