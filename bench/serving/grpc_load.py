"""Closed-loop gRPC load, the benchmarks' wrk for the Open Inference Protocol over gRPC: nghttp2's h2load (C, like
wrk, so the client's CPU stays small) keeps single-row ``ModelInfer`` calls in flight, the request framed once.
h2load sees HTTP statuses only (a gRPC status travels in trailers): callers check the gRPC outcome from the server's
``calib_grpc_requests_total`` or with a gRPC client.

    python -m bench.serving.grpc_load --target 127.0.0.1:8081 --model cifar-resnet56 --shape 3,32,32 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from service.serving.protocol import grpc_predict_v2_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request_bytes(model: str, shape: tuple[int, ...], rows: int = 1) -> bytes:
    """A serialized ``ModelInferRequest`` of ``rows`` seeded rows asking for the probabilities, raw contents."""
    x = np.random.default_rng(1).random((rows, *shape), dtype=np.float32)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.outputs.add(name="probabilities")
    request.raw_input_contents.append(x.tobytes())
    return request.SerializeToString()


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message: an uncompressed flag, the length (4 bytes, big-endian), the bytes."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def load(
    target: str,
    model: str,
    shape: tuple[int, ...],
    clients: int,
    seconds: float,
    connections: int = 1,
    threads: int = 1,
) -> dict:
    """h2load's requests, requests/s, p50 and p99 (ms) and HTTP-level failures."""
    with tempfile.TemporaryDirectory() as tmp:
        body, log = Path(tmp) / "request.grpc", Path(tmp) / "latency.log"
        body.write_bytes(grpc_frame(request_bytes(model, shape)))
        options = {
            "-t": min(threads, connections),
            "-c": connections,
            "-m": max(1, clients // connections),
            "-D": f"{max(1, round(seconds * 1000))}ms",  # h2load times to the millisecond, wrk to the second
            "--log-file": log,
            "-d": body,
        }
        argv = ["h2load", *(str(part) for option in options.items() for part in option)]
        argv += ["-H", "content-type: application/grpc", "-H", "te: trailers", f"http://{target}{METHOD}"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        micros = np.array([int(line.split()[2]) for line in log.read_text().splitlines() if line.strip()])
    done = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    rate = re.search(r"([\d.]+) req/s", out)
    assert done is not None and rate is not None, f"h2load printed no summary:\n{out}"
    ms = micros / 1000 if len(micros) else np.array([np.nan])
    return {
        "requests": int(done.group(1)),
        "requests_per_s": float(rate.group(1)),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "failed": int(done.group(2)) + int(done.group(3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--shape", required=True, help="one row's shape, comma-separated")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    print(json.dumps(load(args.target, args.model, shape, args.clients, args.seconds)))


if __name__ == "__main__":
    main()
