"""The serving benchmark's part of docs/benchmarks.md (``markdown``), and what ``--heavy-only`` prints."""

from __future__ import annotations

import numpy as np

from bench.common import GOAL_COLUMNS, HEAVY, table
from bench.serving.harness import PHASES
from bench.serving.measure import RAW_COLUMNS
from bench.serving.monitoring import CALIBRATION_COLUMNS

GAP_RATIOS = {"service": "vs_raw", "batching_floor": "batching_floor_vs_raw", "ceiling": "ceiling"}
"""The ratios to onnxruntime alone that the gap is split by, by their keys in the heavy rounds."""


def gap_decomposition(heavy: dict) -> list[dict]:
    """Per protocol, the heavy rounds' medians of the service, the batching floor and the ceiling against onnxruntime
    alone, and the gap split in three: the HTTP stack's parsing and answering (1 - ceiling), batching and the
    hand-offs to the inference threads (ceiling - batching floor), and what the service adds (batching floor -
    service)."""
    rows = []
    for side in ("json", "binary"):
        measured = {name: [r[f"{side}_{key}"] for r in heavy["rounds"]] for name, key in GAP_RATIOS.items()}
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
    """The heavy model's rounds, with the gap to onnxruntime alone split by ``gap_decomposition``."""
    return (
        f"\nheavy model at {heavy['clients']} clients on {provider}: the service (JSON, binary v2), onnxruntime "
        f"alone, the baseline in turn\n{table(heavy['rounds'], HEAVY_COLUMNS)}\n\nthe floor app's and wrk's CPU "
        f"ms per request, the ceiling they leave against onnxruntime alone, and the batching floor's ratio\n"
        f"{table(heavy['rounds'], CEILING_COLUMNS)}\n\nthe same over gRPC, and the bare grpcio batching floor's "
        f"ratio\n"
        f"{table(heavy['rounds'], GRPC_COLUMNS)}\n\nthe gap to onnxruntime alone, split (medians of the rounds)\n"
        f"{table(gap_decomposition(heavy), GAP_COLUMNS)}"
    )


LOGGING_COLUMNS = "logging model clients processes rounds cpu_s_per_10k sd min max extra_cpu extra_cpu_range".split()
HEAVY_COLUMNS = (
    "json_rows_per_s json_batch raw_json_rows_per_s json_vs_raw json_ceiling binary_rows_per_s binary_batch "
    "raw_binary_rows_per_s binary_vs_raw binary_ceiling baseline_rows_per_s json_vs_baseline"
).split()
GRPC_COLUMNS = (
    "grpc_rows_per_s grpc_batch raw_grpc_rows_per_s grpc_vs_raw grpc_failed grpc_batching_floor_batch "
    "grpc_batching_floor_vs_raw"
).split()
CEILING_COLUMNS = (
    "json_floor_ms json_client_ms json_ceiling json_batching_floor_batch json_batching_floor_vs_raw "
    "binary_floor_ms binary_client_ms binary_ceiling binary_batching_floor_batch binary_batching_floor_vs_raw"
).split()
GAP_COLUMNS = (
    "protocol rounds service service_range batching_floor batching_floor_range ceiling ceiling_range http_stack "
    "batching_hand_offs service_work"
).split()
SPLIT_COLUMNS = ["model", *PHASES[:3], "queue", "inference", *PHASES[3:]]
LOAD_COLUMNS = "server model rows clients requests_per_s rows_per_s p50_ms p99_ms mean_batch_rows non_2xx".split()


def markdown(result: dict) -> str:
    """The serving benchmark's part of docs/benchmarks.md."""
    serving, monitoring, soak = result, result["monitoring"], result["soak"]
    out = [
        "## Serving",
        f"{serving['seconds_per_point']} s per load point after a warm-up, wrk with one "
        "thread on loopback. `service`: this service (dynamic batching, prediction logging to SQLite, "
        "a store holding the monitoring benchmark's labelled predictions); `baseline`: a plain FastAPI "
        "endpoint calling onnxruntime once per request (bench/serving/baseline_app.py). `mean_batch_rows`: "
        "rows per onnxruntime call the batcher formed at that point.",
    ]
    for model, rows in serving["raw"].items():
        out += [
            f"onnxruntime alone, {model} (the service's sessions and thread settings, all sessions busy at once):",
            table(rows, RAW_COLUMNS),
        ]
    heavy = serving["heavy_rounds"]
    provider = serving["providers"][HEAVY]
    out += [
        table(serving["load"], LOAD_COLUMNS),
        f"The heavy model's goals on {provider}, measured in rounds on the soak server after the sweep: "
        f"the service at {heavy['clients']} single-row clients through JSON `/predict` (`json_`) and "
        "through v2 with the binary tensor extension (`binary_`: the body `tritonclient.http` sends, "
        "replayed by wrk; one inference through tritonclient itself checks it first), onnxruntime alone "
        "at the batch size the service formed in each, and the no-batching baseline, each in turn while "
        "the others idle (rows/s):",
        table(heavy["rounds"], HEAVY_COLUMNS),
        "`ceiling`: the most any server on this HTTP stack could reach in that round. bench/serving/floor_app.py "
        "does on the same uvicorn (uvloop, httptools) only what every server of these requests must: it "
        "reads the body, turns the row into a checked float32 array with the service's own parsers and "
        "answers a fixed body, with no inference. With onnxruntime alone spending t = cores / (its rows/s) "
        "CPU seconds a row, the floor app f and wrk w per request (measured at the same clients), a server "
        "serves at most cores / (t + f + w) rows/s, a ratio of t / (t + f + w). `batching_floor`: the same "
        "app with real inference (FLOOR_MODEL): each row also goes through the service's own batcher to "
        "onnxruntime sessions made as the service makes them and is answered its probabilities, with no "
        "scoring, prediction log, metrics, middleware or validation; `batching_floor_vs_raw` is its rows/s "
        "over onnxruntime alone at the batch size it formed (`batching_floor_batch`), what a batching server "
        "on this stack reaches with nothing the service adds:",
        table(heavy["rounds"], CEILING_COLUMNS),
        "The same over gRPC (`ModelInfer` with raw tensor contents; `bench.serving.grpc_load` runs nghttp2's h2load as "
        "the client: one HTTP/2 connection, 64 calls in flight, the request framed once), and the batching "
        "floor of a bare "
        "grpcio server with the same batcher and sessions (bench/serving/grpc_floor_app.py):",
        table(heavy["rounds"], GRPC_COLUMNS),
        "The gap between the service and onnxruntime alone, split (medians of the rounds, with their ranges): "
        "`http_stack` = 1 - ceiling, what parsing and answering on this stack take; `batching_hand_offs` = "
        "ceiling - batching floor, what batching and the hand-offs to the inference threads and back take; "
        "`service_work` = batching floor - service, what the service adds (scoring, prediction log, metrics, "
        "middleware, validation). Where the third goes: the profile's cores by thread below, the service "
        "beside the batching floor.",
        table(gap_decomposition(heavy), GAP_COLUMNS),
        "Prediction logging: CPU seconds of the server process (user + system, `/proc/<pid>/stat`) per "
        "10,000 single-row requests at 64 clients, read before each 2-second wrk run and after the "
        "prediction log has written its rows; two processes per setting on empty stores, visited in "
        "turn, in reverse order every other round. `extra_cpu`: the ratio of the means to logging off, "
        "minus one; `extra_cpu_range`: the same ratio per measurement (same round and process slot). "
        "PostgreSQL's own CPU is not counted:",
        table(serving["logging"], LOGGING_COLUMNS),
        "Time split of /predict from the service's own histograms (mean ms per request over the model's "
        "sweep; `batch` = queue + inference + hand-back, `total` = the whole request):",
        table([{"model": m} | v for m, v in serving["split"].items()], SPLIT_COLUMNS),
        "Queue time with a configured max queue delay (Server-Timing header of every response):",
        table([serving["queue_delay"]], "max_queue_delay_ms clients requests p50_ms p99_ms max_ms"),
        "## Monitoring",
        f"{monitoring['rows']} labelled predictions stored (SQLite) before the "
        f"service started; measured on {monitoring.get('server', 'a service')}.",
        "GET /calibration (quiet: the same labels reported again; labels arriving: one new label before "
        "every request):",
        table(monitoring["calibration"], CALIBRATION_COLUMNS),
        "POST /feedback:",
        table([monitoring["feedback"]], "batch labels_per_s labels"),
        "## Memory",
        "The soak server's warm-up runs every request shape of the sweep and of the "
        "heavy rounds (binary v2 too) at its top concurrency, a report of every window measured, 3 s of "
        "feedback batches, then one 20-second round of the steady mixed load (single-row predictions of "
        "both models, a batch of labels, a report); the sweep, the heavy model's rounds, the monitoring "
        "measurements and rounds of that mixed load follow on the same process until the minutes of load "
        "are up.",
        f"RSS: {soak['after_shapes_rss_mib']:.1f} MiB right after the largest requests (64 clients of "
        f"32-row requests), {soak['warm_rss_mib']:.1f} MiB after the warm-up, "
        f"{soak['end_rss_mib']:.1f} MiB after {soak['minutes']:.1f} minutes of load "
        f"({100 * soak['growth']:+.1f}%).",
        table(soak["samples"], "minutes rss_mib"),
        "## Goals",
        table(serving["goals"], GOAL_COLUMNS),
    ]
    return "\n\n".join(out) + "\n"
