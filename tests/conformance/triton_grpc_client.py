"""tritonclient.grpc, unchanged, against a running service's gRPC port. It runs in a process of its own: the
protocol's messages are named alike in tritonclient's modules and in the service's (package ``inference``), and
protobuf keeps one registry of names per process.

    python tests/conformance/triton_grpc_client.py 127.0.0.1:8081 '{"digits-lenet5": [1, 8, 8]}'

For each model: the server's and the model's readiness and metadata, then one inference of 3 seeded rows
(raw tensor contents both ways), a request with a wrong shape; and one request to an unknown model. Prints one
JSON line with what came back, errors as their gRPC status and message.
"""

import json
import sys

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException


def rows(shape: list[int]) -> np.ndarray:
    return np.random.default_rng(0).random((3, *shape), dtype=np.float32)


def infer(client, model: str, x: np.ndarray) -> dict:
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    try:
        result = client.infer(
            model,
            [tensor],
            outputs=[triton.InferRequestedOutput("probabilities"), triton.InferRequestedOutput("prediction_id")],
        )
    except InferenceServerException as exc:
        return {"status": exc.status(), "message": exc.message()}
    response = result.get_response(as_json=True)
    return {
        "probabilities": result.as_numpy("probabilities").tolist(),
        "ids": [i.decode() for i in result.as_numpy("prediction_id").tolist()],
        "parameters": response.get("parameters", {}),
        "id": response.get("id"),
        "model_version": response.get("model_version"),
    }


def main() -> None:
    address, shapes = sys.argv[1], json.loads(sys.argv[2])
    client = triton.InferenceServerClient(address)
    out = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(as_json=True),
        "models": {},
    }
    for model, shape in shapes.items():
        meta = client.get_model_metadata(model, as_json=True)
        bad = rows(shape)[:, :, :-1]  # one column short
        out["models"][model] = {
            "ready": client.is_model_ready(model),
            "metadata": meta,
            "infer": infer(client, model, rows(shape)),
            "bad_shape": infer(client, model, bad),
        }
    out["unknown_model"] = infer(client, "no-such-model", rows(next(iter(shapes.values()))))
    try:
        client.get_model_metadata("no-such-model")
        out["unknown_metadata"] = None
    except InferenceServerException as exc:
        out["unknown_metadata"] = {"status": exc.status(), "message": exc.message()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
