"""The usual alternative a user would write: a plain FastAPI endpoint calling onnxruntime once per
request, no batching, no calibration monitoring. Used only as the benchmarks' baseline.

    python -m bench.serving.baseline_app --model artifacts/digits-lenet5/1/model.onnx --port 8001
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from service.serving.runtime import provider_options
from service.settings import Device, Settings


class Request(BaseModel):
    inputs: list


def build(model_path: str, device: Device = "cpu") -> FastAPI:
    session = ort.InferenceSession(model_path, providers=provider_options(Settings(device=device)))
    shape = tuple(session.get_inputs()[0].shape[1:])
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/predict")
    def predict(request: Request) -> dict:
        x = np.asarray(request.inputs, dtype=np.float32).reshape(-1, *shape)
        logits, probabilities = session.run(["logits", "probabilities"], {"input": x})
        return {"probabilities": probabilities.tolist()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="cpu",
        help="as the service's CALIB_DEVICE: the same providers and CUDA options are asked for",
    )
    args = parser.parse_args()
    uvicorn.run(build(args.model, args.device), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
