"""KServe's own client and data models against a running service (run in the kserve venv, .venv-kserve: kserve
pins a starlette that the service's own venv does not take).

    .venv-kserve/bin/python tests/conformance/kserve_client.py http://127.0.0.1:8000 digits-lenet5 1,8,8

Checks with kserve's pydantic models (``kserve.protocol.rest.v2_datamodels``) every v2 answer the service gives,
then infers through ``InferenceRESTClient`` with JSON and with binary tensors. Prints one JSON line: the
probabilities and prediction ids each way, for the caller to compare with the service's own answers.
"""

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, RESTConfig
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from kserve.protocol.rest import v2_datamodels as models


def check_models(url: str, model: str, rows: np.ndarray) -> None:
    """Every v2 answer validated by kserve's own response model."""
    models.ServerMetadataResponse.model_validate(httpx.get(f"{url}/v2").json())
    models.ServerLiveResponse.model_validate(httpx.get(f"{url}/v2/health/live").json())
    models.ServerReadyResponse.model_validate(httpx.get(f"{url}/v2/health/ready").json())
    models.ModelReadyResponse.model_validate(httpx.get(f"{url}/v2/models/{model}/ready").json())
    models.ModelMetadataResponse.model_validate(httpx.get(f"{url}/v2/models/{model}").json())
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}]}
    models.InferenceRequest.model_validate(body)
    answer = httpx.post(f"{url}/v2/models/{model}/infer", json=body)
    answer.raise_for_status()
    models.InferenceResponse.model_validate(answer.json())


async def infer(url: str, model: str, rows: np.ndarray, binary: bool) -> dict:
    """One inference through InferenceRESTClient: InferRequest.to_rest() adds model_name and, for binary
    tensors, the Inference-Header-Content-Length header."""
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    tensor = InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    outputs = [
        RequestedOutput("probabilities", {"binary_data": binary}),
        RequestedOutput("prediction_id", {"binary_data": binary}),
    ]
    response = await client.infer(url, InferRequest(model, [tensor], request_outputs=outputs), model_name=model)
    by_name = {o.name: o for o in response.outputs}
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in by_name["prediction_id"].as_numpy().tolist()]
    return {
        "probabilities": by_name["probabilities"].as_numpy().astype(np.float32).tolist(),
        "ids": ids,
        "model_name": response.model_name,
        "id": response.id,
    }


def main() -> None:
    url, model, shape = sys.argv[1], sys.argv[2], tuple(int(d) for d in sys.argv[3].split(","))
    rows = np.random.default_rng(0).random((3, *shape), dtype=np.float32)
    check_models(url, model, rows)
    print(
        json.dumps(
            {
                "json": asyncio.run(infer(url, model, rows, binary=False)),
                "binary": asyncio.run(infer(url, model, rows, binary=True)),
            }
        )
    )


if __name__ == "__main__":
    main()
