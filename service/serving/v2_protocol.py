"""The Open Inference Protocol v2 shared by both transports: messages, tensors, request checks, output encoding."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from calibkit.conformal import METHODS
from calibkit.validation import is_number
from service import __version__
from service.errors import InvalidInput
from service.serving.conformal import SetChoice
from service.serving.repository import ModelRepository, ServedModel

PREDICTION_ID = "prediction_id"
"""The v2 output tensor (BYTES, one per row) of the rows' prediction ids, which POST /feedback takes."""
PREDICTION_SET = "prediction_set"
"""The v2 output tensor (BOOL, [N, K]) of the rows' conformal prediction sets, when named in ``outputs``."""
P_VALUES = "conformal_p_values"
"""The v2 output tensor (FP32, [N, K]) of the rows' conformal p-values per class, when named in ``outputs``."""
V2_DATATYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "FP16": np.float16,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
}


class V2OutputTensor(BaseModel):
    name: str
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class V2Tensor(V2OutputTensor):
    """An input tensor of the v2 protocol; ``data`` is flat or nested, in row-major order. Fields the protocol
    does not define are ignored, as its schema allows."""

    model_config = ConfigDict(extra="ignore")


class V2RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    parameters: dict[str, Any] | None = None


class V2InferenceRequest(BaseModel):
    """A v2 inference request. Fields the protocol does not define (``model_name``, which Triton's and
    KServe's clients send) are ignored, as its schema allows."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[V2Tensor] = Field(min_length=1)
    outputs: list[V2RequestedOutput] | None = None


class V2ResponseParameters(BaseModel):
    """The response's parameters, each a string, number or boolean as the protocol requires."""

    model_config = ConfigDict(extra="allow")

    prediction_ids: str = Field(
        description="the rows' prediction ids, comma-separated, in order (also the "
        "BYTES output tensor prediction_id); POST /feedback refers to them"
    )


class V2InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str = Field(description="the request's id, or one made for the response when the request had none")
    parameters: V2ResponseParameters
    outputs: list[V2OutputTensor]


class V2TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]
    parameters: dict[str, str | int | float | bool] = Field(
        description="the manifest's classes and preprocessing (each JSON-encoded in a string, as the protocol "
        "allows only strings, numbers and booleans) and the image polarity that images sent to /predict must have"
    )


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class V2Error(BaseModel):
    error: str


def server_metadata() -> dict:
    return {"name": "calibrated-serving", "version": __version__, "extensions": ["binary_tensor_data"]}


def model_metadata(repository: ModelRepository, name: str, version: str | None) -> V2ModelMetadata:
    """A version's v2 metadata, its classes, preprocessing and image polarity as parameters."""
    model = repository.get(name, version)
    pre = model.manifest.preprocessing
    parameters: dict[str, str | int | float | bool] = {
        "classes": json.dumps(model.manifest.class_names),
        "preprocessing": json.dumps(None if pre is None else pre.model_dump()),
    }
    if pre is not None:
        parameters["image_polarity"] = (
            "dark strokes on a light background (the service inverts images)"
            if pre.invert
            else "as the training images"
        )
    return V2ModelMetadata(
        name=model.name,
        versions=sorted(repository.models[model.name], key=int),
        platform="onnxruntime_onnx",
        inputs=[V2TensorMetadata(name=model.manifest.input.name, datatype="FP32", shape=[-1, *model.shape])],
        outputs=[V2TensorMetadata(name=n, datatype=d, shape=[-1, *s]) for n, d, s in listed_outputs(model)],
        parameters=parameters,
    )


def listed_outputs(model: ServedModel) -> list[tuple[str, str, list[int]]]:
    """The outputs a version's v2 metadata lists (and an infer naming none answers), as (name, datatype, shape after
    the batch axis)."""
    k = len(model.manifest.class_names)
    listed = [(model.manifest.outputs[o], "FP32", [k]) for o in ("logits", "probabilities")]
    listed.append((PREDICTION_ID, "BYTES", []))
    if model.sets.available:
        listed += [(PREDICTION_SET, "BOOL", [k]), (P_VALUES, "FP32", [k])]
    return listed


def input_batch(
    model: ServedModel, request: V2InferenceRequest, values: dict[str, np.ndarray | list], max_rows: int
) -> np.ndarray:
    """The request's one input tensor (its values in ``values``) as a float32 batch of the model's input shape, at
    most ``max_rows`` rows of finite values (422 naming the field otherwise)."""
    if len(request.inputs) != 1:
        raise InvalidInput(f"expected exactly 1 input tensor, got {len(request.inputs)}", field="inputs")
    tensor = request.inputs[0]
    if tensor.name != model.manifest.input.name:
        raise InvalidInput(
            f"unknown input {tensor.name!r}; the model's input is {model.manifest.input.name!r}", field="inputs[0].name"
        )
    if tensor.datatype not in V2_DATATYPES:
        raise InvalidInput(
            f"datatype {tensor.datatype!r} is not supported; use one of {', '.join(V2_DATATYPES)}",
            field="inputs[0].datatype",
        )
    if len(tensor.shape) != 1 + len(model.shape) or tuple(tensor.shape[1:]) != model.shape or tensor.shape[0] < 1:
        raise InvalidInput(
            f"shape {tensor.shape} does not match the model input [N, {', '.join(map(str, model.shape))}]",
            field="inputs[0].shape",
        )
    if tensor.shape[0] > max_rows:
        raise InvalidInput(f"batch of {tensor.shape[0]} rows exceeds the limit of {max_rows}", field="inputs[0].shape")
    x = values.get(tensor.name)
    if x is None:
        raise InvalidInput("has no data (send 'data' or use the binary tensor extension)", field="inputs[0].data")
    x = x if isinstance(x, np.ndarray) else _flat_data(x)
    if x.size != math.prod(tensor.shape):
        raise InvalidInput(
            f"holds {x.size} values but shape {tensor.shape} needs {math.prod(tensor.shape)}", field="inputs[0].data"
        )
    x = x.reshape(tensor.shape).astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise InvalidInput("contains NaN or infinite values", field="inputs[0].data")
    return x


def _flat_data(data) -> np.ndarray:
    """A JSON tensor's flat or nested ``data`` as one flat array, converted once (an error naming the field)."""
    if not isinstance(data, list):
        raise InvalidInput("must be an array of numbers", field="inputs[0].data")
    try:
        array = np.asarray(data)
    except ValueError:
        raise InvalidInput("must be a flat or rectangular nested array of numbers", field="inputs[0].data") from None
    if array.dtype == bool or array.dtype.kind not in "iuf":
        raise InvalidInput("must hold only numbers", field="inputs[0].data")
    return array.ravel()


def requested_outputs(model: ServedModel, request: V2InferenceRequest) -> list[str]:
    """The outputs a request names, else every output the metadata lists (422 naming one it does not answer)."""
    known = [*model.runtime.output_names, PREDICTION_ID, PREDICTION_SET, P_VALUES]
    requested = [o.name for o in request.outputs] if request.outputs else [n for n, _, _ in listed_outputs(model)]
    unknown = [o for o in requested if o not in known]
    if unknown:
        raise InvalidInput(f"unknown outputs {unknown}; the model has {known}", field="outputs")
    return requested


def flag(parameters: dict, name: str) -> bool | None:
    """A boolean request parameter, None when absent (422 naming it when it is not a boolean)."""
    value = parameters.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidInput(f"must be true or false, got {value!r}", field=f"parameters.{name}")
    return value


def set_choice(model: ServedModel, parameters: dict, requested: list[str]) -> SetChoice | None:
    """The sets a v2 request asks for through its outputs or parameters (422 naming a malformed parameter)."""
    coverage, method = parameters.get("coverage"), parameters.get("set_method")
    if coverage is not None and (not is_number(coverage) or not 0 < coverage < 1):
        raise InvalidInput(f"must be a number in (0, 1), got {coverage!r}", field="parameters.coverage")
    if method is not None and method not in METHODS:
        raise InvalidInput(f"must be one of {list(METHODS)}, got {method!r}", field="parameters.set_method")
    randomized = flag(parameters, "randomized")
    wanted = PREDICTION_SET in requested or P_VALUES in requested
    if not wanted and coverage is None and method is None and randomized is None:
        return None
    if wanted and not model.sets.available:
        raise InvalidInput(f"this model version serves no prediction sets: {model.sets.reason}", field="outputs")
    return model.sets.choice(method, coverage, P_VALUES in requested, field="parameters.", randomized=randomized)


def encoded(values: np.ndarray) -> tuple[str, np.ndarray]:
    """An output's v2 datatype (BYTES for strings, BOOL for sets, FP32 for numbers) and its values in it."""
    if values.dtype == object:
        return "BYTES", values
    datatype = "BOOL" if values.dtype == bool else "FP32"
    return datatype, np.ascontiguousarray(values, dtype=bool if datatype == "BOOL" else "<f4")


def raw_contents(datatype: str, values: np.ndarray) -> bytes:
    """An ``encoded`` tensor's raw bytes: a BYTES element as its 4-byte little-endian length, then its UTF-8 bytes."""
    if datatype != "BYTES":
        return values.tobytes()
    out = bytearray()
    for value in values.ravel():
        text = str(value).encode()
        out += len(text).to_bytes(4, "little") + text
    return bytes(out)
