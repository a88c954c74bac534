"""Open Inference Protocol v2 (KServe v2; spoken by Triton and MLServer) over the same models.

Includes the binary tensor data extension that ``tritonclient.http`` uses by default: a request
whose JSON header is followed by raw tensor bytes (``Inference-Header-Content-Length``), and
outputs returned as raw bytes when asked for with ``binary_data`` / ``binary_data_output``.
Inferences are logged for monitoring like /predict; the rows' prediction ids, which POST /feedback
refers to, come back as the BYTES output tensor ``prediction_id`` (unless an ``outputs`` list leaves it
out) and, comma-separated, as the response parameter ``prediction_ids``: the protocol allows only
strings, numbers and booleans as parameter values. The response's ``id`` is the request's, or a fresh
one when the request has none (the protocol's response format and KServe's response model require one).
A request with ``"parameters": {"prediction_ids_format": "list"}`` gets the list of earlier releases
instead (deprecated, for one release).
"""

from __future__ import annotations

import uuid

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from service.endpoints import CurrentEndpoints, current
from service.errors import InvalidInput
from service.schemas import V2Error, V2InferenceRequest, V2InferenceResponse, V2ModelMetadata, V2ServerMetadata
from service.serving.codec import Phases, PlainRoute, validate
from service.serving.dataplane import V2_DATATYPES, bytes_tensor, server_metadata

router = APIRouter(prefix="/v2", tags=["v2"])
HEADER_LENGTH = "inference-header-content-length"
ERRORS = {code: {"model": V2Error} for code in (400, 404, 413, 503)}
# The binary tensor extension cannot be written as an OpenAPI body (the split of the bytes is given by a
# header), so the document declares the JSON form and says how to send the binary one.
INFER_BODY = {
    "requestBody": {
        "required": True,
        "description": (
            "JSON, or with the binary tensor data extension: the JSON header followed by the raw tensor bytes, the "
            "header's length in bytes given by the Inference-Header-Content-Length header (as tritonclient.http sends)."
        ),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/V2InferenceRequest"}}},
    }
}


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


class InferEndpoint:
    """POST /v2/models/{name}[/versions/{version}]/infer as a plain ASGI endpoint (``service.serving.codec``),
    the fast path of /predict: the JSON header is validated by pydantic without the tensors' values. A binary
    tensor becomes an array without per-value Python objects (``numpy.frombuffer``), JSON ``data`` an array in
    one conversion of the parsed lists; only sizes, shapes and finiteness are checked on them."""

    def __init__(self, template: str):
        self.template = template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        endpoints = current(request)
        phases = Phases(endpoints.metrics.phases(self.template))
        body, arrays = _parse(await request.body(), request.headers.get(HEADER_LENGTH))
        phases.mark("parse")
        params = scope["path_params"]
        model, outputs, ids = await endpoints.dataplane.v2_infer(
            params["name"], params.get("version"), body, arrays, phases
        )
        response = _encode(model.name, model.version, body, outputs, ids)
        phases.mark("encode")
        await response(scope, receive, send)


def infer_contract(body: V2InferenceRequest, name: str) -> V2InferenceResponse:
    """Inference in the Open Inference Protocol v2 on the model's latest version, JSON or with binary tensors."""
    raise NotImplementedError("documentation only: InferEndpoint serves the v2 infer routes")


def infer_version_contract(body: V2InferenceRequest, name: str, version: str) -> V2InferenceResponse:
    """Inference in the Open Inference Protocol v2 on one version of the model, JSON or with binary tensors."""
    raise NotImplementedError("documentation only: InferEndpoint serves the v2 infer routes")


INFER_PATHS = {
    "/v2/models/{name}/infer": infer_contract,
    "/v2/models/{name}/versions/{version}/infer": infer_version_contract,
}
INFER_ROUTES = [PlainRoute(path, InferEndpoint(path), methods=["POST"]) for path in INFER_PATHS]
INFER_CONTRACTS = [
    APIRoute(
        path,
        contract,
        methods=["POST"],
        response_model=V2InferenceResponse,
        responses=ERRORS,
        tags=["v2"],
        name="infer",
        openapi_extra=INFER_BODY,
    )
    for path, contract in INFER_PATHS.items()
]


def _parse(raw: bytes, declared: str | None) -> tuple[V2InferenceRequest, dict[str, np.ndarray | list]]:
    """The validated JSON header and every input's values by input name: an array for a binary tensor, the
    JSON ``data`` as parsed (converted once it is known to be wanted: ``DataPlane.v2_infer``)."""
    split = len(raw)
    if declared is not None:
        if not declared.isdigit() or int(declared) > len(raw):
            raise InvalidInput(
                f"Inference-Header-Content-Length {declared!r} does not fit a body of {len(raw)} bytes", field="headers"
            )
        split = int(declared)
    try:
        data = orjson.loads(raw[:split])
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"is not valid JSON: {exc}", field="body") from None
    values = {}
    if isinstance(data, dict) and isinstance(data.get("inputs"), list):
        data = dict(data)
        data["inputs"] = [_without_data(tensor, values, i) for i, tensor in enumerate(data["inputs"])]
    body = validate(V2InferenceRequest, data)
    arrays = _binary_inputs(body, raw[split:])
    for i, tensor in enumerate(body.inputs):
        if i in values and tensor.name not in arrays:
            arrays[tensor.name] = values[i]
    return body, arrays


def _without_data(tensor, values: dict, index: int):
    """A JSON input tensor without its ``data``, which is kept in ``values`` (by input index); anything else is
    left for validation to name."""
    if isinstance(tensor, dict) and "data" in tensor:
        values[index] = tensor["data"]
        return {key: value for key, value in tensor.items() if key != "data"}
    return tensor


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


def _encode(
    name: str, version: str, body: V2InferenceRequest, outputs: dict[str, np.ndarray], ids: list[str]
) -> Response:
    binary_all = bool((body.parameters or {}).get("binary_data_output", False))
    wanted = {o.name: bool((o.parameters or {}).get("binary_data", binary_all)) for o in body.outputs or []}
    tensors, blobs = [], []
    for output, values in outputs.items():
        strings = values.dtype == object
        if not strings:
            values = np.ascontiguousarray(values, dtype=np.float32)
        tensor = {"name": output, "datatype": "BYTES" if strings else "FP32", "shape": list(values.shape)}
        if wanted.get(output, binary_all):
            raw = bytes_tensor(values) if strings else values.tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            tensor["data"] = values.tolist() if strings else values.ravel().tolist()
        tensors.append(tensor)
    legacy = (body.parameters or {}).get("prediction_ids_format") == "list"
    header = orjson.dumps(
        {
            "model_name": name,
            "model_version": version,
            "id": body.id or uuid.uuid4().hex,
            "parameters": {"prediction_ids": ids if legacy else ",".join(ids)},
            "outputs": tensors,
        }
    )
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
