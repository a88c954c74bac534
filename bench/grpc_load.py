"""Closed-loop gRPC load, the benchmarks' wrk for the Open Inference Protocol over gRPC: ``--clients`` calls in
flight on one channel for ``--seconds``, each a single-row ``ModelInfer`` with raw tensor contents, sent as
bytes serialized once (so the client spends its CPU on gRPC, not on building messages). Prints one JSON line:
requests, requests/s, p50 and p99 latency in ms, and errors by status.

    python -m bench.grpc_load --target 127.0.0.1:8081 --model cifar-resnet56 --shape 3,32,32 --clients 64 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc
import numpy as np

from service.serving.protocol import grpc_predict_v2_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request_bytes(model: str, shape: tuple[int, ...], rows: int = 1) -> bytes:
    """A serialized single-row ``ModelInferRequest`` asking for the probabilities, raw contents both ways."""
    x = np.random.default_rng(1).random((rows, *shape), dtype=np.float32)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.outputs.add(name="probabilities")
    request.raw_input_contents.append(x.tobytes())
    return request.SerializeToString()


async def load(target: str, payload: bytes, clients: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)

        async def client(deadline: float) -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    await call(payload, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    continue
                latencies.append(time.perf_counter() - started)

        start = time.perf_counter()
        await asyncio.gather(*(client(start + seconds) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([np.nan])
    return {"requests": len(latencies), "requests_per_s": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--shape", required=True, help="one row's shape, comma-separated")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    payload = request_bytes(args.model, tuple(int(d) for d in args.shape.split(",")))
    print(json.dumps(asyncio.run(load(args.target, payload, args.clients, args.seconds))))


if __name__ == "__main__":
    main()
