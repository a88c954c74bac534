"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), served by ``grpc.aio`` on the
service's own event loop beside the REST routes: the same ``DataPlane`` (batcher, prediction log, prediction
ids), the same metrics, and gRPC status codes mapped from the same typed errors (``STATUS``).

Inputs come as ``raw_input_contents`` (the fast path: bytes become an array without a copy) or as typed
``contents``; outputs always go back as ``raw_output_contents``, the probabilities as little-endian FP32 and
the prediction ids as the BYTES tensor ``prediction_id`` (each element a 4-byte little-endian length, then its
bytes), and, comma-separated, as the response parameter ``prediction_ids``, as over REST.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from pydantic import ValidationError

from service.auth import ACCESS, Access
from service.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    Forbidden,
    InvalidInput,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    StorageUnavailable,
    Unauthorized,
    UnsupportedMediaType,
    field_path,
)
from service.metrics import Phases
from service.serving.protocol import grpc_predict_v2_pb2 as pb
from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc
from service.serving.v2_protocol import (
    V2_DATATYPES,
    V2InferenceRequest,
    encoded,
    model_metadata,
    raw_contents,
    server_metadata,
)

if TYPE_CHECKING:
    from service.parts import ServiceParts

log = logging.getLogger("service.serving.grpc")

SERVICE = "inference.GRPCInferenceService"
STATUS: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    UnsupportedMediaType: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.UNAVAILABLE,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    EngineUnavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.UNAVAILABLE,
    StorageUnavailable: grpc.StatusCode.UNAVAILABLE,
    Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
}
"""The gRPC status of each typed error (REST answers the same errors with their HTTP status)."""
CONTENTS = {
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
}
"""The ``InferTensorContents`` field that carries each input datatype the service takes."""


def status_of(exc: ServiceError) -> grpc.StatusCode:
    """The gRPC status of a typed error: that of its nearest class in ``STATUS``."""
    return next((STATUS[kind] for kind in type(exc).__mro__ if kind in STATUS), grpc.StatusCode.INTERNAL)


def parameters(message) -> dict:
    """A protobuf ``map<string, InferParameter>`` as a dict of plain values."""
    out = {}
    for key, value in message.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(value, which)
    return out


def inference_request(request: pb.ModelInferRequest) -> tuple[V2InferenceRequest, dict[str, np.ndarray]]:
    """The request as the REST path's ``V2InferenceRequest`` and each input's values by name (``InvalidInput``
    naming the field where it is malformed)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"holds {len(raw)} entries for {len(request.inputs)} inputs", field="raw_input_contents")
    data = {
        "id": request.id or None,
        "parameters": parameters(request.parameters) or None,
        "inputs": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "datatype": t.datatype,
                "parameters": parameters(t.parameters) or None,
            }
            for t in request.inputs
        ],
        "outputs": [{"name": o.name, "parameters": parameters(o.parameters) or None} for o in request.outputs] or None,
    }
    try:
        body = V2InferenceRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(first["msg"], field=field_path(first["loc"])) from None
    values = {}
    for i, tensor in enumerate(request.inputs):
        dtype = V2_DATATYPES.get(tensor.datatype)
        if dtype is None:
            raise InvalidInput(
                f"datatype {tensor.datatype!r} is not supported; use one of {', '.join(V2_DATATYPES)}",
                field=f"inputs[{i}].datatype",
            )
        if raw:
            if len(raw[i]) % np.dtype(dtype).itemsize:
                raise InvalidInput(
                    f"{len(raw[i])} bytes are not a whole number of {tensor.datatype} values",
                    field=f"raw_input_contents[{i}]",
                )
            values[tensor.name] = np.frombuffer(raw[i], dtype=dtype)
        elif tensor.HasField("contents"):
            if tensor.datatype not in CONTENTS:
                raise InvalidInput(
                    f"{tensor.datatype} values travel only as raw_input_contents (the protocol has no "
                    "typed contents field for them)",
                    field=f"inputs[{i}].contents",
                )
            values[tensor.name] = np.asarray(getattr(tensor.contents, CONTENTS[tensor.datatype]), dtype=dtype)
    return body, values


def inference_response(
    name: str,
    version: str,
    request_id: str | None,
    outputs: dict[str, np.ndarray],
    ids: list[str],
    info: dict | None = None,
) -> pb.ModelInferResponse:
    """The response: every output as raw contents (FP32; BYTES for ``prediction_id``; BOOL, one byte per value,
    for ``prediction_set``), the prediction ids also as the string parameter ``prediction_ids``, the sets'
    method, coverage, threshold and its version as parameters (``info``), and the request's id (a fresh one
    when it had none)."""
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id or uuid.uuid4().hex)
    response.parameters["prediction_ids"].string_param = ",".join(ids)
    for key, value in (info or {}).items():
        if isinstance(value, bool):
            response.parameters[key].bool_param = value
        elif isinstance(value, str):
            response.parameters[key].string_param = value
        else:
            response.parameters[key].double_param = float(value)
    for output, values in outputs.items():
        datatype, values = encoded(values)
        response.outputs.add(name=output, datatype=datatype, shape=list(values.shape))
        response.raw_output_contents.append(raw_contents(datatype, values))
    return response


def rpc(access: Access) -> Callable[[Callable[..., Awaitable]], Callable[..., Awaitable]]:
    """A servicer method from ``handler(self, request)``, declaring who may call it (``access``, as an HTTP route
    does in ``service.http.routes``): a token group's method first checks its tokens (metadata ``authorization:
    Bearer <token>``, UNAUTHENTICATED without one); typed errors end the call with their status (``STATUS``),
    anything else with INTERNAL (logged); every call is counted and timed by method and status."""
    if access not in ACCESS:
        raise ValueError(f"a gRPC method declares no access group (access={access!r}): give one of {list(ACCESS)}")

    def wrap(handler: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
        method = handler.__name__

        @functools.wraps(handler)
        async def call(self, request, context: grpc.aio.ServicerContext):
            metrics, started, code = self.parts.metrics, time.perf_counter(), grpc.StatusCode.OK
            try:
                if access != "open":
                    metadata = dict(context.invocation_metadata() or ())
                    self.parts.access.check(access, metadata.get("authorization"))
                return await handler(self, request)
            except ServiceError as exc:
                code = status_of(exc)
                await context.abort(code, f"{exc.field}: {exc.message}" if exc.field else exc.message)
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("unexpected error in gRPC %s", method)
                await context.abort(code, "internal error; see the server log")
            finally:
                metrics.grpc_requests.labels(method, code.name).inc()
                metrics.grpc_latency.labels(method).observe(time.perf_counter() - started)

        call.access = access  # type: ignore[attr-defined]
        return call

    return wrap


def method_access(servicer: object) -> dict[str, Access]:
    """The access group each method of the inference service declares (``rpc``). A method of the service's
    descriptor that declares none, or is not implemented, stops the start (fail closed)."""
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    declared = {name: getattr(getattr(servicer, name, None), "access", None) for name in methods}
    missing = sorted(name for name, access in declared.items() if access not in ACCESS)
    if missing:
        raise RuntimeError(f"gRPC methods without an access group (declare one with rpc(...)): {missing}")
    return declared  # type: ignore[return-value]


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Each call turns protobuf into one call on the service's parts and the result back into protobuf (``rpc``)."""

    def __init__(self, parts: ServiceParts):
        self.parts = parts
        self.phase_histograms = parts.metrics.phases("gRPC ModelInfer")

    @rpc("open")
    async def ServerLive(self, request):
        return pb.ServerLiveResponse(live=True)

    @rpc("open")
    async def ServerReady(self, request):
        return pb.ServerReadyResponse(ready=self.parts.is_ready())

    @rpc("open")
    async def ModelReady(self, request):
        try:
            self.parts.model_ready(request.name, request.version or None)
        except NotReady:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @rpc("open")
    async def ServerMetadata(self, request):
        return pb.ServerMetadataResponse(**server_metadata())

    @rpc("open")
    async def ModelMetadata(self, request):
        meta = model_metadata(self.parts.repository, request.name, request.version or None)

        def tensors(items):
            return [
                pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in items
            ]

        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=tensors(meta.inputs),
            outputs=tensors(meta.outputs),
        )

    @rpc("predict")
    async def ModelInfer(self, request):
        phases = Phases(self.phase_histograms)
        body, values = inference_request(request)
        phases.mark("parse")
        model, outputs, ids, info = await self.parts.dataplane.v2_infer(
            request.model_name, request.model_version or None, body, values, phases
        )
        response = inference_response(model.name, model.version, body.id, outputs, ids, info)
        phases.mark("encode")
        return response


class Health(health_aio.HealthServicer):
    """``grpc.health.v1.Health`` (grpcio-health-checking), for Kubernetes' gRPC probes and grpc_health_probe: the
    server ("") and ``SERVICE`` answer SERVING while the service is ready (``ServiceParts.is_ready``: started, not
    stopping, a model version ready), NOT_SERVING otherwise. ``Check`` reads readiness when asked; ``Watch``ers
    hear of a change within ``POLL_SECONDS``. Open to every caller, as ``/v2/health/*`` is."""

    POLL_SECONDS = 1.0

    def __init__(self, parts: ServiceParts) -> None:
        super().__init__()
        self.parts = parts

    async def sync(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.parts.is_ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE):
            if self._server_status.get(name) != status:
                await self.set(name, status)

    async def Check(self, request, context):
        await self.sync()
        return await super().Check(request, context)

    async def watch_readiness(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.POLL_SECONDS)


class GrpcServer:
    """The running gRPC server, its health service and the task that keeps the health current."""

    def __init__(self, server: grpc.aio.Server, health: Health) -> None:
        self.server, self.health = server, health
        self._watch = asyncio.get_running_loop().create_task(health.watch_readiness())

    async def stop(self, grace: float) -> None:
        """NOT_SERVING first (probes and watchers hear it), then the server's graceful stop."""
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start(parts: ServiceParts) -> GrpcServer | None:
    """The gRPC server on ``settings.host:settings.grpc_port`` (0: a free port) with ``Health`` beside the inference
    service, started, its port recorded on ``parts.grpc_port``; None when ``settings.grpc`` is off. A port that
    cannot be bound stops the start."""
    settings = parts.settings
    if not settings.grpc:
        return None
    limit = settings.limits.max_body_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)])
    servicer = InferenceServicer(parts)
    method_access(servicer)  # every method declares who may call it, or no start
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    health = Health(parts)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    address = f"{settings.host}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(
            f"gRPC cannot listen on {address}: {exc} (set CALIB_GRPC_PORT, or CALIB_GRPC=false)"
        ) from None
    await server.start()
    parts.grpc_port = port
    log.info("gRPC (%s, grpc.health.v1) on %s:%d", SERVICE, settings.host, port)
    return GrpcServer(server, health)
