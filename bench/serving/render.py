"""The serving benchmark's tables: what ``python -m bench.serving`` prints, and the columns and the gap
decomposition that ``bench.run_all`` puts on docs/benchmarks.md."""

from __future__ import annotations

import numpy as np

from bench import monitoring
from bench.common import table
from bench.serving.measure import HEAVY


def gap_decomposition(heavy: dict) -> list[dict]:
    """Per protocol, the heavy rounds' medians (and ranges) of the service, the batching floor and the ceiling
    against onnxruntime alone, and the gap between the service and onnxruntime alone split in three: what the
    HTTP stack's parsing and answering take (1 - ceiling), what batching and the hand-offs to the inference
    threads and back take (ceiling - batching floor), and what the service adds to that (batching floor -
    service)."""
    rows = []
    for side in ("json", "binary"):
        measured = {
            name: [r[f"{side}_{key}"] for r in heavy["rounds"]]
            for name, key in (
                ("service", "vs_raw"),
                ("batching_floor", "batching_floor_vs_raw"),
                ("ceiling", "ceiling"),
            )
        }
        medians = {name: float(np.median(values)) for name, values in measured.items()}
        rows.append(
            {"protocol": side, "rounds": len(heavy["rounds"])}
            | medians
            | {f"{name}_range": f"{min(values):.3f}-{max(values):.3f}" for name, values in measured.items()}
            | {
                "http_stack": 1 - medians["ceiling"],
                "batching_hand_offs": medians["ceiling"] - medians["batching_floor"],
                "service_work": medians["batching_floor"] - medians["service"],
            }
        )
    return rows


def heavy_report(heavy: dict, provider: str) -> str:
    """The heavy model's rounds, per round the ceiling of this HTTP stack (``ceiling``) and the batching floor, and
    the gap to onnxruntime alone split between them (``gap_decomposition``)."""
    return (
        f"\nheavy model at {heavy['clients']} clients on {provider}: the service (JSON, binary v2), onnxruntime "
        f"alone, the baseline in turn\n{table(heavy['rounds'], HEAVY_COLUMNS)}\n\nthe floor app's and wrk's CPU "
        f"ms per request, the ceiling they leave against onnxruntime alone, and the batching floor's ratio\n"
        f"{table(heavy['rounds'], CEILING_COLUMNS)}\n\nthe same over gRPC, and the bare grpcio batching floor's "
        f"ratio\n"
        f"{table(heavy['rounds'], GRPC_COLUMNS)}\n\nthe gap to onnxruntime alone, split (medians of the rounds)\n"
        f"{table(gap_decomposition(heavy), GAP_COLUMNS)}"
    )


LOGGING_COLUMNS = [
    "logging",
    "model",
    "clients",
    "processes",
    "rounds",
    "cpu_s_per_10k",
    "sd",
    "min",
    "max",
    "extra_cpu",
    "extra_cpu_range",
]
HEAVY_COLUMNS = [
    "json_rows_per_s",
    "json_batch",
    "raw_json_rows_per_s",
    "json_vs_raw",
    "json_ceiling",
    "binary_rows_per_s",
    "binary_batch",
    "raw_binary_rows_per_s",
    "binary_vs_raw",
    "binary_ceiling",
    "baseline_rows_per_s",
    "json_vs_baseline",
]
GRPC_COLUMNS = [
    "grpc_rows_per_s",
    "grpc_batch",
    "raw_grpc_rows_per_s",
    "grpc_vs_raw",
    "grpc_failed",
    "grpc_batching_floor_batch",
    "grpc_batching_floor_vs_raw",
]
CEILING_COLUMNS = [
    "json_floor_ms",
    "json_client_ms",
    "json_ceiling",
    "json_batching_floor_batch",
    "json_batching_floor_vs_raw",
    "binary_floor_ms",
    "binary_client_ms",
    "binary_ceiling",
    "binary_batching_floor_batch",
    "binary_batching_floor_vs_raw",
]
GAP_COLUMNS = [
    "protocol",
    "rounds",
    "service",
    "service_range",
    "batching_floor",
    "batching_floor_range",
    "ceiling",
    "ceiling_range",
    "http_stack",
    "batching_hand_offs",
    "service_work",
]
LOAD_COLUMNS = [
    "server",
    "model",
    "rows",
    "clients",
    "requests_per_s",
    "rows_per_s",
    "p50_ms",
    "p99_ms",
    "mean_batch_rows",
    "non_2xx",
]


def report(result: dict, calibration: list[dict], memory: dict) -> str:
    """The run's tables: the load points, the heavy model's rounds, the prediction log's CPU cost, the
    GET /calibration latency, the memory over the soak and the goals."""
    return "\n".join(
        [
            "\nclosed-loop load (wrk, loopback)\n" + table(result["load"], LOAD_COLUMNS),
            heavy_report(result["heavy_rounds"], result["providers"][HEAVY]),
            "\nprediction logging: server CPU seconds per 10,000 requests\n"
            + table(result["logging"], LOGGING_COLUMNS),
            "\nGET /calibration\n" + table(calibration, monitoring.CALIBRATION_COLUMNS),
            f"\nmemory: {memory['warm_rss_mib']:.1f} MiB after the warm-up, {memory['end_rss_mib']:.1f} MiB after "
            f"{memory['minutes']:.1f} minutes of load",
            "\ngoals (ratios within this run)\n"
            + table(result["goals"], ["goal", "measured", "target", "met", "note"]),
        ]
    )
