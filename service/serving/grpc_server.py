"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``) on the service's event loop, with the
same ``DataPlane``, metrics and typed errors (``STATUS``) as REST; inputs as raw or typed contents, outputs raw.
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
from service.errors import InvalidInput, NotReady, ServiceError, field_path
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
STATUS: dict[int, grpc.StatusCode] = {
    422: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
}
"""The gRPC status of each HTTP status the typed errors answer over REST."""
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
    """The gRPC status of a typed error: that of its HTTP status in ``STATUS``."""
    return STATUS.get(exc.status, grpc.StatusCode.INTERNAL)


def parameters(message) -> dict:
    """A protobuf ``map<string, InferParameter>`` as a dict of plain values."""
    out = {}
    for key, value in message.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(value, which)
    return out


def inference_request(request: pb.ModelInferRequest) -> tuple[V2InferenceRequest, dict[str, np.ndarray]]:
    """The request as a ``V2InferenceRequest`` and each input's values by name (``InvalidInput`` naming the field)."""
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
    """The response: every output as raw contents, the ids also as the parameter ``prediction_ids``, the sets'
    description (``info``) as parameters, and the request's id (a fresh one when it had none)."""
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
    """A servicer method that declares who may call it (``access``); typed errors end the call with their status."""
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
    """The access group each method of the inference service declares (``rpc``); one without stops the start."""
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
    """``grpc.health.v1.Health`` for Kubernetes' gRPC probes: the server ("") and ``SERVICE`` are SERVING while
    ``ServiceParts.is_ready``, else NOT_SERVING; ``Watch``ers hear of a change within ``POLL_SECONDS``. Open to all."""

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
    """The gRPC server with ``Health``, started on ``settings.host:settings.grpc_port`` (0: a free port, recorded on
    ``parts.grpc_port``); None when ``settings.grpc`` is off."""
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
