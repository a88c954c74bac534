"""HTTP service that serves calibrated probabilities from ONNX models (built in a later issue)."""
