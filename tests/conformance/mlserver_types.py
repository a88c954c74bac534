"""MLServer's own data models (``mlserver.types``) against a running service (run in the mlserver venv,
.venv-mlserver: mlserver pins a starlette that neither the service's venv nor kserve's takes).

    .venv-mlserver/bin/python tests/conformance/mlserver_types.py http://127.0.0.1:8000 digits-lenet5 1,8,8

Validates the server and model metadata and a JSON inference with MLServer's pydantic models (which have no
binary tensor extension); prints one JSON line with the validated response's probabilities and ids.
"""

import json
import sys

import httpx
import numpy as np
from mlserver import types


def main() -> None:
    url, model, shape = sys.argv[1], sys.argv[2], tuple(int(d) for d in sys.argv[3].split(","))
    rows = np.random.default_rng(0).random((3, *shape), dtype=np.float32)
    types.MetadataServerResponse.model_validate(httpx.get(f"{url}/v2").json())
    types.MetadataModelResponse.model_validate(httpx.get(f"{url}/v2/models/{model}").json())
    request = types.InferenceRequest(
        inputs=[types.RequestInput(name="input", shape=list(rows.shape), datatype="FP32", data=rows.ravel().tolist())]
    )
    answer = httpx.post(
        f"{url}/v2/models/{model}/infer",
        content=request.model_dump_json(exclude_none=True),
        headers={"content-type": "application/json"},
    )
    answer.raise_for_status()
    response = types.InferenceResponse.model_validate(answer.json())
    outputs = {o.name: o for o in response.outputs}
    assert outputs["prediction_id"].datatype in (types.Datatype.BYTES, "BYTES"), outputs["prediction_id"]
    print(
        json.dumps(
            {
                "probabilities": np.asarray(outputs["probabilities"].data.root, np.float32)
                .reshape(outputs["probabilities"].shape)
                .tolist(),
                "ids": list(outputs["prediction_id"].data.root),
            }
        )
    )


if __name__ == "__main__":
    main()
