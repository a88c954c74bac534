"""Open Inference Protocol v2 (KServe v2) over the same models, with the binary tensor data extension of
``tritonclient.http``; the rows' prediction ids come back as the BYTES output ``prediction_id``.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import orjson
from fastapi import Request, Response

from service.errors import InvalidInput
from service.http.codec import validate
from service.metrics import Phases
from service.parts import Parts, parts_of
from service.serving import v2_protocol
from service.serving.v2_protocol import (
    V2_DATATYPES,
    V2InferenceRequest,
    V2ModelMetadata,
    encoded,
    raw_contents,
    server_metadata,
)

HEADER_LENGTH = "inference-header-content-length"


async def server() -> dict:
    return server_metadata()


async def live() -> dict:
    return {"live": True}


async def ready(parts: Parts) -> dict:
    return parts.server_ready()


async def model_metadata(parts: Parts, name: str, version: str | None = None) -> V2ModelMetadata:
    return v2_protocol.model_metadata(parts.repository, name, version)


async def model_ready(parts: Parts, name: str, version: str | None = None) -> dict:
    return parts.model_ready(name, version)


async def infer(request: Request) -> Response:
    """Inference in the Open Inference Protocol v2, JSON or with binary tensors.
    \f
    The JSON header is validated without the tensors' values, which become arrays in one conversion."""
    parts = parts_of(request)
    phases = Phases(parts.metrics.phases(request.scope["route"].path))
    body, arrays = _parse(await request.body(), request.headers.get(HEADER_LENGTH))
    phases.mark("parse")
    params = request.path_params
    model, outputs, ids, info = await parts.dataplane.v2_infer(
        params["name"], params.get("version"), body, arrays, phases
    )
    response = _encode(model.name, model.version, body, outputs, ids, info)
    phases.mark("encode")
    return response


def _parse(raw: bytes, declared: str | None) -> tuple[V2InferenceRequest, dict[str, np.ndarray | list]]:
    """The validated JSON header and every input's values by name: binary arrays, or the JSON ``data`` as parsed."""
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
    values: dict[int, Any] = {}
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
    """A JSON input tensor without its ``data``, kept in ``values`` by input index."""
    if isinstance(tensor, dict) and "data" in tensor:
        values[index] = tensor["data"]
        return {key: value for key, value in tensor.items() if key != "data"}
    return tensor


def _binary_inputs(body: V2InferenceRequest, blob: bytes) -> dict[str, np.ndarray | list]:
    """The binary tensors after the JSON header, by input name (the JSON ``data`` of the others joins them)."""
    arrays: dict[str, np.ndarray | list] = {}
    offset = 0
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
    name: str, version: str, body: V2InferenceRequest, outputs: dict[str, np.ndarray], ids: list[str], info: dict
) -> Response:
    binary_all = bool((body.parameters or {}).get("binary_data_output", False))
    wanted = {o.name: bool((o.parameters or {}).get("binary_data", binary_all)) for o in body.outputs or []}
    tensors, blobs = [], []
    for output, values in outputs.items():
        datatype, values = encoded(values)
        tensor: dict[str, Any] = {"name": output, "datatype": datatype, "shape": list(values.shape)}
        if wanted.get(output, binary_all):
            raw = raw_contents(datatype, values)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            tensor["data"] = values.tolist() if datatype == "BYTES" else values.ravel().tolist()
        tensors.append(tensor)
    legacy = (body.parameters or {}).get("prediction_ids_format") == "list"
    header = orjson.dumps(
        {
            "model_name": name,
            "model_version": version,
            "id": body.id or uuid.uuid4().hex,
            "parameters": {"prediction_ids": ids if legacy else ",".join(ids), **info},
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
