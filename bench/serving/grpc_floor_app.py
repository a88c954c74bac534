"""The batching floor over gRPC: a bare ``grpc.aio`` server answering ``ModelInfer`` through the batching floor of
``bench.serving.floor_app`` (the raw input as float32 rows, the probabilities as raw contents), nothing else;
``/floor.Floor/Stats`` answers the rows and onnxruntime calls it has run, as JSON bytes.

    FLOOR_MODEL=artifacts/cifar-resnet56/1/model.onnx python -m bench.serving.grpc_floor_app --port 8002
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import grpc
import numpy as np

from bench.serving.floor_app import PROBABILITIES, BatchingFloor
from service.serving.protocol import grpc_predict_v2_pb2 as pb


async def serve(port: int, model: Path) -> None:
    floor = BatchingFloor(model)
    floor.batcher.start()

    async def infer(request: pb.ModelInferRequest, context) -> pb.ModelInferResponse:
        x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32)
        outputs, _ = await floor.batcher.submit(x.reshape(-1, *floor.row_shape))
        probabilities = np.ascontiguousarray(outputs[PROBABILITIES], dtype=np.float32)
        response = pb.ModelInferResponse(model_name=request.model_name)
        response.outputs.add(name=PROBABILITIES, datatype="FP32", shape=list(probabilities.shape))
        response.raw_output_contents.append(probabilities.tobytes())
        return response

    async def stats(request: bytes, context) -> bytes:
        return json.dumps({"rows": floor.rows, "calls": floor.calls}).encode()

    infer_handler = grpc.unary_unary_rpc_method_handler(
        infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
    )
    services = {
        "inference.GRPCInferenceService": {"ModelInfer": infer_handler},
        "floor.Floor": {"Stats": grpc.unary_unary_rpc_method_handler(stats)},
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(n, m) for n, m in services.items()])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        await server.wait_for_termination()
    finally:
        await floor.batcher.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, Path(os.environ["FLOOR_MODEL"])))


if __name__ == "__main__":
    main()
