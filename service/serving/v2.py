"""Open Inference Protocol v2 (KServe v2; spoken by Triton and MLServer) over the same models.

Includes the binary tensor data extension that ``tritonclient.http`` uses by default: a request
whose JSON header is followed by raw tensor bytes (``Inference-Header-Content-Length``), and
outputs returned as raw bytes when asked for with ``binary_data`` / ``binary_data_output``.
Inferences are logged for monitoring like /predict; the response's ``parameters.prediction_ids``
(one per row) are the ids POST /feedback refers to.
"""

from __future__ import annotations

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response

from service.serving.codec import validate
from service.serving.dataplane import V2_DATATYPES, server_metadata
from service.endpoints import CurrentEndpoints
from service.errors import InvalidInput
from service.schemas import V2Error, V2InferenceRequest, V2InferenceResponse, V2ModelMetadata, V2ServerMetadata

router = APIRouter(prefix="/v2", tags=["v2"])
HEADER_LENGTH = "inference-header-content-length"
ERRORS = {code: {"model": V2Error} for code in (400, 404, 413, 503)}
# The binary tensor extension cannot be written as an OpenAPI body (the split of the bytes is given by a
# header), so the document declares the JSON form and says how to send the binary one.
INFER_BODY = {"requestBody": {"required": True, "description": (
    "JSON, or with the binary tensor data extension: the JSON header followed by the raw tensor bytes, the "
    "header's length in bytes given by the Inference-Header-Content-Length header (as tritonclient.http sends)."),
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/V2InferenceRequest"}}}}}


@router.get("", response_model=V2ServerMetadata)
async def server() -> dict:
    return server_metadata()


@router.get("/health/live", responses={200: {"content": {"application/json": {}}}})
async def live() -> dict:
    return {"live": True}


@router.get("/health/ready", responses={503: {"model": V2Error}})
async def ready(endpoints: CurrentEndpoints) -> dict:
    return endpoints.server_ready()


@router.get("/models/{name}", response_model=V2ModelMetadata, responses=ERRORS)
@router.get("/models/{name}/versions/{version}", response_model=V2ModelMetadata, responses=ERRORS)
async def model_metadata(endpoints: CurrentEndpoints, name: str, version: str | None = None) -> V2ModelMetadata:
    return endpoints.dataplane.v2_metadata(name, version)


@router.get("/models/{name}/ready", responses=ERRORS)
@router.get("/models/{name}/versions/{version}/ready", responses=ERRORS)
async def model_ready(endpoints: CurrentEndpoints, name: str, version: str | None = None) -> dict:
    return endpoints.model_ready(name, version)


@router.post("/models/{name}/infer", response_model=V2InferenceResponse, responses=ERRORS, openapi_extra=INFER_BODY)
@router.post("/models/{name}/versions/{version}/infer", response_model=V2InferenceResponse, responses=ERRORS,
             openapi_extra=INFER_BODY)
async def infer(request: Request, endpoints: CurrentEndpoints, name: str, version: str | None = None) -> Response:
    body, binary = await _parse(request)
    model, outputs, ids = await endpoints.dataplane.v2_infer(name, version, body, binary)
    return _encode(model.name, model.version, body, outputs, ids)


async def _parse(request: Request) -> tuple[V2InferenceRequest, dict[str, np.ndarray]]:
    raw = await request.body()
    declared = request.headers.get(HEADER_LENGTH)
    split = len(raw)
    if declared is not None:
        if not declared.isdigit() or int(declared) > len(raw):
            raise InvalidInput(f"Inference-Header-Content-Length {declared!r} does not fit a body of {len(raw)} bytes",
                               field="headers")
        split = int(declared)
    try:
        data = orjson.loads(raw[:split])
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"is not valid JSON: {exc}", field="body") from None
    body = validate(V2InferenceRequest, data)
    return body, _binary_inputs(body, raw[split:])


def _binary_inputs(body: V2InferenceRequest, blob: bytes) -> dict[str, np.ndarray]:
    arrays, offset = {}, 0
    for i, tensor in enumerate(body.inputs):
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is None:
            continue
        field = f"inputs[{i}].parameters.binary_data_size"
        dtype = V2_DATATYPES.get(tensor.datatype)
        if dtype is None:
            raise InvalidInput(f"datatype {tensor.datatype!r} is not supported", field=f"inputs[{i}].datatype")
        if not isinstance(size, int) or size < 0 or offset + size > len(blob) or size % np.dtype(dtype).itemsize:
            raise InvalidInput(f"{size!r} does not fit the {len(blob) - offset} binary bytes left", field=field)
        arrays[tensor.name] = np.frombuffer(blob, dtype=dtype, count=size // np.dtype(dtype).itemsize, offset=offset)
        offset += size
    if offset != len(blob):
        raise InvalidInput(f"{len(blob) - offset} binary bytes are not claimed by any input", field="body")
    return arrays


def _encode(name: str, version: str, body: V2InferenceRequest, outputs: dict[str, np.ndarray],
            ids: list[str]) -> Response:
    binary_all = bool((body.parameters or {}).get("binary_data_output", False))
    wanted = {o.name: bool((o.parameters or {}).get("binary_data", binary_all)) for o in body.outputs or []}
    tensors, blobs = [], []
    for output, values in outputs.items():
        values = np.ascontiguousarray(values, dtype=np.float32)
        tensor = {"name": output, "datatype": "FP32", "shape": list(values.shape)}
        if wanted.get(output, binary_all):
            raw = values.tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            tensor["data"] = values.ravel().tolist()
        tensors.append(tensor)
    header = orjson.dumps({"model_name": name, "model_version": version, "id": body.id,
                           "parameters": {"prediction_ids": ids}, "outputs": tensors})
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(header + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(header))})
