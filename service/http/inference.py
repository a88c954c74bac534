"""The service's own inference API: /predict (a fast handler), /models, /health, /metrics."""

from __future__ import annotations

import base64

from fastapi import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from service.errors import InvalidInput
from service.http.codec import MULTIPART, decode, media_type, respond, validate
from service.http.numeric_json import WORTH_IT_BYTES, numeric_rows
from service.metrics import Phases
from service.parts import Parts, parts_of
from service.schemas import HealthResponse, ModelsResponse, PredictRequest
from service.serving.dataplane import DataPlane


async def predict(request: Request) -> Response:
    """Calibrated probabilities for a batch of rows (arrays or base64 PNG/JPEG images).
    \f
    Times its phases in the server's histograms and tells the client its queue and inference time in a
    ``Server-Timing`` header (W3C Server Timing)."""
    parts = parts_of(request)
    phases = Phases(parts.metrics.phases("/predict"))
    body, model, x = await _prepared(request, parts.dataplane, parts.settings.limits.max_rows_per_request, phases)
    result, timing = await parts.dataplane.predict(model, body, x, phases)
    response = respond(
        result,
        headers={
            "Server-Timing": (
                f"queue;dur={1000 * timing.queue_seconds:.3f}, infer;dur={1000 * timing.inference_seconds:.3f}"
            )
        },
    )
    phases.mark("encode")
    return response


async def _prepared(request: Request, dataplane: DataPlane, max_files: int, phases: Phases) -> tuple:
    """The request's options, model and float32 batch; a large JSON body of numeric rows is parsed straight into an
    array (``service.http.numeric_json``) where it can be."""
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
    """A multipart/form-data /predict: every uploaded file a row, the other form fields those of the JSON body."""
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


async def models(parts: Parts) -> ModelsResponse:
    """Every loaded model and version: classes, calibration, temperature, provider, batching."""
    return parts.dataplane.models()


async def health(request: Request, response: Response, parts: Parts) -> HealthResponse:
    """Readiness with details: loaded models and their providers, refused artifacts; the store's last error
    only with the admin token."""
    body = await parts.health(admin=parts.access.allows("admin", request.headers.get("authorization")))
    response.status_code = 200 if body.ready else 503
    return body


async def metrics(parts: Parts) -> Response:
    """Prometheus text exposition."""
    return Response(parts.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
