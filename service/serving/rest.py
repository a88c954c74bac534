"""The service's own REST API: /predict, /models, /health, /metrics. Thin: each route makes one call on
``Endpoints`` (or the data plane it holds)."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from service.endpoints import CurrentEndpoints, current
from service.errors import InvalidInput
from service.schemas import ErrorResponse, HealthResponse, ModelsResponse, PredictRequest, PredictResponse
from service.serving.codec import MULTIPART, Phases, PlainRoute, decode, media_type, respond, validate
from service.serving.dataplane import DataPlane
from service.serving.numeric_json import WORTH_IT_BYTES, numeric_rows

router = APIRouter()

ERRORS = {
    400: {"model": ErrorResponse, "description": "request body is not valid JSON"},
    404: {"model": ErrorResponse, "description": "unknown model or version"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    415: {"model": ErrorResponse, "description": "Content-Type is neither application/json nor multipart/form-data"},
    422: {"model": ErrorResponse, "description": "invalid request: the error names the field"},
    503: {"model": ErrorResponse, "description": "overloaded (see Retry-After) or not ready"},
}


class PredictEndpoint:
    """POST /predict as a plain ASGI endpoint (see ``service.serving.codec``): calibrated probabilities for a
    batch of rows (arrays or base64 PNG/JPEG images). Times its phases in the server's histograms and
    tells the client its queue and inference time in a ``Server-Timing`` header (W3C Server Timing)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        endpoints = current(request)
        phases = Phases(endpoints.metrics.phases("/predict"))
        body, model, x = await _prepared(request, endpoints.dataplane, endpoints.settings.max_rows_per_request, phases)
        result, timing = await endpoints.dataplane.predict(model, body, x, phases)
        response = respond(
            result,
            headers={
                "Server-Timing": (
                    f"queue;dur={1000 * timing.queue_seconds:.3f}, infer;dur={1000 * timing.inference_seconds:.3f}"
                )
            },
        )
        phases.mark("encode")
        await response(scope, receive, send)


async def _prepared(request: Request, dataplane: DataPlane, max_files: int, phases: Phases) -> tuple:
    """The request's options, model and float32 batch. A large JSON body of numeric rows is parsed straight
    into an array (``service.serving.numeric_json``); any other body, or one that path leaves to the general
    one, is decoded and validated as a whole. Only the batch outlives this call (see ``DataPlane.prepare``)."""
    if media_type(request, "application/json", MULTIPART) == MULTIPART:
        payload = await _uploaded(request, max_files)
    else:
        raw = await request.body()
        numeric = numeric_rows(raw, "inputs") if len(raw) >= WORTH_IT_BYTES else None
        if numeric is not None:
            phases.mark("parse")
            # None: the general path names what is wrong (its decoding then counts as validation)
            return dataplane.prepare_numeric(*numeric) or dataplane.prepare(validate(PredictRequest, decode(raw)))
        payload = decode(raw)
    phases.mark("parse")
    return dataplane.prepare(validate(PredictRequest, payload))


async def _uploaded(request: Request, max_files: int) -> dict:
    """A multipart/form-data /predict (``curl -F file=@digit.png``): every uploaded file is a row (the i-th
    is ``inputs[i]``), the other form fields are those of the JSON body (``model``, ``top_k``, ...)."""
    try:
        form = await request.form(max_files=max_files)
    except HTTPException as exc:  # Starlette's 400 for a malformed body or too many files
        raise InvalidInput(f"is not a valid multipart/form-data body: {exc.detail}", field="body") from None
    rows, fields = [], {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            rows.append(base64.b64encode(await value.read()).decode())
        else:
            fields[name] = value  # text; validation converts "3" and "true" as it would 3 and true
    await form.close()
    if not rows:
        raise InvalidInput("holds no file: upload each image as a file field (curl -F file=@image.png)", field="inputs")
    return fields | {"inputs": rows}


def predict_contract(body: PredictRequest) -> PredictResponse:
    """Calibrated probabilities for a batch of rows (arrays or base64 PNG/JPEG images)."""
    raise NotImplementedError("documentation only: PredictEndpoint serves POST /predict")


PREDICT_ROUTES = [PlainRoute("/predict", PredictEndpoint(), methods=["POST"])]
UPLOAD = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "format": "binary"},
            "description": "PNG or JPEG images, one row each, in the polarity the model was trained on",
        },
        **{name: {"type": "string"} for name in ("model", "version", "top_k", "return_logits", "return_uncalibrated")},
    },
}
PREDICT_CONTRACT = APIRoute(
    "/predict",
    predict_contract,
    methods=["POST"],
    response_model=PredictResponse,
    responses=ERRORS,
    tags=["inference"],
    name="predict",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}},
                MULTIPART: {"schema": UPLOAD},
            },
        }
    },
)


@router.get("/models", response_model=ModelsResponse, tags=["models"])
async def models(endpoints: CurrentEndpoints) -> ModelsResponse:
    """Every loaded model and version: classes, calibration, temperature, provider, batching."""
    return endpoints.dataplane.models()


@router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}}, tags=["health"])
async def health(request: Request, response: Response, endpoints: CurrentEndpoints) -> HealthResponse:
    """Readiness with details: loaded models and their providers, refused artifacts; the store's last error
    only with the admin token."""
    body = await endpoints.health(admin=endpoints.access.allows("admin", request.headers.get("authorization")))
    response.status_code = 200 if body.ready else 503
    return body


@router.get(
    "/metrics",
    tags=["health"],
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(endpoints: CurrentEndpoints) -> Response:
    """Prometheus text exposition."""
    return Response(endpoints.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
