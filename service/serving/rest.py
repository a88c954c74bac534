"""The service's own REST API: /predict, /models, /health, /metrics. Thin: it delegates to DataPlane."""

from __future__ import annotations

import base64

import anyio
import onnxruntime as ort
from fastapi import APIRouter, Request, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from service import __version__
from service.auth import is_admin
from service.serving.codec import MULTIPART, Phases, PlainRoute, decode, media_type, respond, validate
from service.errors import InvalidInput
from service.schemas import ErrorResponse, HealthResponse, ModelsResponse, PredictRequest, PredictResponse

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
        dataplane = scope["app"].state.dataplane
        phases = Phases(dataplane.metrics.phases("/predict"))
        request = Request(scope, receive)
        if media_type(request, "application/json", MULTIPART) == MULTIPART:
            payload = await _uploaded(request)
        else:
            payload = decode(await request.body())
        phases.mark("parse")
        body = validate(PredictRequest, payload)
        model, x = dataplane.prepare(body)
        # The rows live on as one float32 array: free their Python objects (about 8 times its size) before
        # waiting for the batch, so memory grows with concurrent requests by their arrays only.
        del payload
        body.inputs = []
        phases.mark("validate")
        outputs, timing = await dataplane.infer(model, x)
        phases.mark("batch")
        response = respond(dataplane.respond(model, body, outputs), headers={"Server-Timing": (
            f"queue;dur={1000 * timing.queue_seconds:.3f}, infer;dur={1000 * timing.inference_seconds:.3f}")})
        phases.mark("encode")
        await response(scope, receive, send)


async def _uploaded(request: Request) -> dict:
    """A multipart/form-data /predict (``curl -F file=@digit.png``): every uploaded file is a row (the i-th
    is ``inputs[i]``), the other form fields are those of the JSON body (``model``, ``top_k``, ...)."""
    try:
        form = await request.form(max_files=request.app.state.settings.max_rows_per_request)
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
        raise InvalidInput("holds no file: upload each image as a file field (curl -F file=@image.png)",
                           field="inputs")
    return fields | {"inputs": rows}


def predict_contract(body: PredictRequest) -> PredictResponse:
    """Calibrated probabilities for a batch of rows (arrays or base64 PNG/JPEG images)."""
    raise NotImplementedError("documentation only: PredictEndpoint serves POST /predict")


PREDICT_ROUTES = [PlainRoute("/predict", PredictEndpoint(), methods=["POST"])]
UPLOAD = {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"},
             "description": "PNG or JPEG images, one row each, in the polarity the model was trained on"},
    **{name: {"type": "string"} for name in ("model", "version", "top_k", "return_logits", "return_uncalibrated")}}}
PREDICT_CONTRACT = APIRoute("/predict", predict_contract, methods=["POST"], response_model=PredictResponse,
                            responses=ERRORS, tags=["inference"], name="predict",
                            openapi_extra={"requestBody": {"required": True, "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}},
                                MULTIPART: {"schema": UPLOAD}}}})


@router.get("/models", response_model=ModelsResponse, tags=["models"])
async def models(request: Request) -> ModelsResponse:
    """Every loaded model and version: classes, calibration, temperature, provider, batching."""
    return request.app.state.dataplane.models()


@router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}}, tags=["health"])
async def health(request: Request, response: Response) -> HealthResponse:
    """Readiness with details: loaded models and their providers, refused artifacts; the store's last error
    only with the admin token."""
    state = request.app.state
    repository = state.dataplane.repository
    models = [{"name": m.name, "version": m.version, "ready": m.ready, "provider": m.runtime.provider,
               "requested_providers": m.runtime.requested, "sessions": len(m.runtimes),
               "queued_rows": m.batcher.queued_rows if m.batcher else 0}
              for m in repository.all()]
    ready = state.ready and any(m["ready"] for m in models)
    db = state.store.db
    store_up = await anyio.to_thread.run_sync(db.ping)
    state.metrics.storage_up.set(int(store_up))
    store = {"backend": db.engine.dialect.name, "up": store_up,
             "prediction_log_pending": state.prediction_log.pending}
    if is_admin(request):
        store["error"] = db.last_error  # the driver's text: hosts, ports, database names
    status = "not_ready" if not ready else ("degraded" if repository.failed or not store_up else "ok")
    if not ready:
        response.status_code = 503
    return HealthResponse(status=status, ready=ready, models=models, failed_artifacts=repository.failed, storage=store,
                          device=state.settings.device, available_providers=ort.get_available_providers(),
                          onnxruntime=ort.__version__, version=__version__)


@router.get("/metrics", tags=["health"], response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
