"""Serving: requests in, a batch through onnxruntime, calibrated probabilities out, every row logged."""
