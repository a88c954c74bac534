"""Run every benchmark and write docs/benchmarks.md from their JSON results.

python -m bench.run_all [--smoke] [--device cuda]   (make bench; --smoke: seconds, for CI, times not asserted)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.auth import COLUMNS as AUTH_COLUMNS
from bench.auth import goals as auth_goals
from bench.common import RESULTS, ROOT, machine, table
from bench.feedback_load import COLUMNS as FEEDBACK_LOAD_COLUMNS
from bench.feedback_load import DURABILITY_COLUMNS
from bench.feedback_load import goals as feedback_load_goals
from bench.gpu import recorded_section
from bench.monitoring import CALIBRATION_COLUMNS
from bench.profile import COLUMNS as PROFILE_COLUMNS
from bench.profile import COMPARED_COLUMNS as PROFILE_COMPARED_COLUMNS
from bench.profile import PROTOCOLS as PROFILE_PROTOCOLS
from bench.profile import THREAD_COLUMNS as PROFILE_THREAD_COLUMNS
from bench.serving.measure import PHASES, RAW_COLUMNS
from bench.serving.render import (
    CEILING_COLUMNS,
    GAP_COLUMNS,
    GRPC_COLUMNS,
    HEAVY_COLUMNS,
    LOAD_COLUMNS,
    LOGGING_COLUMNS,
    gap_decomposition,
)

SPLIT_COLUMNS = [*PHASES[:3], "queue", "inference", *PHASES[3:]]

# serving also measures monitoring and memory; profile: where the server's CPU goes under the heavy model
BENCHMARKS = ("fit_temperature", "training", "serving", "profile", "feedback_load", "auth")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", nargs="*", default=list(BENCHMARKS))
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="the serving benchmark's")
    args = parser.parse_args()
    for name in args.only:
        print(f"\n=== {name}", flush=True)
        extra = ["--device", args.device] if name == "serving" else []
        subprocess.run(
            [sys.executable, "-m", f"bench.{name}", *extra, *(["--smoke"] if args.smoke else [])], check=True, cwd=ROOT
        )
    if not args.smoke:
        (ROOT / "docs" / "benchmarks.md").write_text(render())
        print(f"\nwrote {ROOT / 'docs' / 'benchmarks.md'}")


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render() -> str:
    m = machine()
    recorded = (_load("serving") or {}).get("machine", {}).get("commit")
    m["commit"] = recorded or m["commit"]  # the page is of the run that measured it, not of the rendering
    out = [
        "# Benchmarks",
        "",
        f'Measured by `make bench` on {m["cores"]} cores of "{m["cpu"]}" ({m["isa"]}), {m["memory_gib"]} GiB, '
        f"{m['gpu'] or 'no GPU'}, Python {m['python']}, at commit `{m['commit']}`. Client (wrk) and server share "
        "the machine; absolute numbers drift on shared machines, so goals are stated as ratios measured in one "
        "run. On a machine with an NVIDIA GPU: `pip install onnxruntime-gpu` (with the CUDA and cuDNN "
        "libraries it names) and `python -m bench.run_all --device cuda`; the goals are then the GPU's.",
        "",
    ]
    fit = _load("fit_temperature")
    if fit:
        out += [
            "## fit_temperature",
            "",
            table(fit["results"], ["objective", "n", "classes", "fitted_T", "best_s", "median_s"]),
            "",
        ]
    training = _load("training")
    if training:
        out += [
            "## Training: the default `python -m training run`",
            "",
            table([training], ["job", "seconds", "peak_rss_mib"]),
            "",
        ]
    serving = _load("serving")
    if serving:
        out += [
            "## Serving",
            "",
            f"{serving['seconds_per_point']} s per load point after a warm-up, wrk with one "
            "thread on loopback. `service`: this service (dynamic batching, prediction logging to SQLite, "
            "a store holding the monitoring benchmark's labelled predictions); `baseline`: a plain FastAPI "
            "endpoint calling onnxruntime once per request (bench/baseline_app.py). `mean_batch_rows`: "
            "rows per onnxruntime call the batcher formed at that point.",
            "",
        ]
        for model, rows in serving["raw"].items():
            out += [
                f"onnxruntime alone, {model} (the service's sessions and thread settings, all sessions busy at once):",
                "",
                table(rows, RAW_COLUMNS),
                "",
            ]
        heavy = serving["heavy_rounds"]
        provider = serving["providers"]["cifar-resnet56"]
        out += [
            table(serving["load"], LOAD_COLUMNS),
            "",
            f"The heavy model's goals on {provider}, measured in rounds on the soak server after the sweep: "
            f"the service at {heavy['clients']} single-row clients through JSON `/predict` (`json_`) and "
            "through v2 with the binary tensor extension (`binary_`: the body `tritonclient.http` sends, "
            "replayed by wrk; one inference through tritonclient itself checks it first), onnxruntime alone "
            "at the batch size the service formed in each, and the no-batching baseline, each in turn while "
            "the others idle (rows/s):",
            "",
            table(heavy["rounds"], HEAVY_COLUMNS),
            "",
            "`ceiling`: the most any server on this HTTP stack could reach in that round. bench/floor_app.py "
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
            "",
            table(heavy["rounds"], CEILING_COLUMNS),
            "",
            "The same over gRPC (`ModelInfer` with raw tensor contents; `bench.grpc_load` runs nghttp2's h2load as "
            "the client: one HTTP/2 connection, 64 calls in flight, the request framed once), and the batching "
            "floor of a bare "
            "grpcio server with the same batcher and sessions (bench/grpc_floor_app.py):",
            "",
            table(heavy["rounds"], GRPC_COLUMNS),
            "",
            "The gap between the service and onnxruntime alone, split (medians of the rounds, with their ranges): "
            "`http_stack` = 1 - ceiling, what parsing and answering on this stack take; `batching_hand_offs` = "
            "ceiling - batching floor, what batching and the hand-offs to the inference threads and back take; "
            "`service_work` = batching floor - service, what the service adds (scoring, prediction log, metrics, "
            "middleware, validation). Where the third goes: the profile's cores by thread below, the service "
            "beside the batching floor.",
            "",
            table(gap_decomposition(heavy), GAP_COLUMNS),
            "",
            "Prediction logging: CPU seconds of the server process (user + system, `/proc/<pid>/stat`) per "
            "10,000 single-row requests at 64 clients, read before each 2-second wrk run and after the "
            "prediction log has written its rows; two processes per setting on empty stores, visited in "
            "turn, in reverse order every other round. `extra_cpu`: the ratio of the means to logging off, "
            "minus one; `extra_cpu_range`: the same ratio per measurement (same round and process slot). "
            "PostgreSQL's own CPU is not counted:",
            "",
            table(serving["logging"], LOGGING_COLUMNS),
            "",
            "Time split of /predict from the service's own histograms (mean ms per request over the model's "
            "sweep; `batch` = queue + inference + hand-back, `total` = the whole request):",
            "",
            table([{"model": m} | v for m, v in serving["split"].items()], ["model", *SPLIT_COLUMNS]),
            "",
            "Queue time with a configured max queue delay (Server-Timing header of every response):",
            "",
            table(
                [serving["queue_delay"]], ["max_queue_delay_ms", "clients", "requests", "p50_ms", "p99_ms", "max_ms"]
            ),
            "",
        ]
    profile = _load("profile")
    if profile:
        out += [
            "## Where the server's CPU goes",
            "",
            "py-spy samples of every thread of a service process (on-CPU samples, 200 per second) while wrk drives "
            "single-row clients at the heavy model (bench/profile.py), through each protocol on a fresh process. A "
            "sample counts for the stage of its innermost frame that names one. Of the machine's "
            f"{m['cores']} cores, what the server and wrk leave is idle.",
            "",
        ]
        for run in profile["runs"]:
            out += [
                f"{PROFILE_PROTOCOLS[run['protocol']]}, {run['clients']} clients at {run['model']} for "
                f"{run['seconds']:.0f} s: {run['requests_per_s']:.0f} requests/s, "
                f"{run['server_cpu_ms_per_request']:.2f} server CPU ms per request, "
                f"{run['server_cores_busy']:.2f} cores busy in the server and {run['client_cores_busy']:.2f} "
                "in wrk:",
                "",
                table(run["stages"], PROFILE_COLUMNS),
                "",
            ]
            if run.get("unprofiled"):
                out += [
                    f"The same load just before, without the profiler: {run['unprofiled']['requests_per_s']:.0f} "
                    "requests/s; the machine's cores by thread (/proc), and as milliseconds per request:",
                    "",
                    table(run["unprofiled"]["threads"], PROFILE_THREAD_COLUMNS),
                    "",
                ]
            if run.get("compared"):
                out += [
                    f"The batching floor (bench/floor_app.py serving the model through the service's batcher, "
                    f"nothing else) under the same load: {run['batching_floor']['requests_per_s']:.0f} requests/s; "
                    "its cores against the service's, inference threads summed, and what the service adds per "
                    "request:",
                    "",
                    table(run["compared"], PROFILE_COMPARED_COLUMNS),
                    "",
                ]
    monitoring = _load("monitoring")
    if monitoring:
        out += [
            "## Monitoring",
            "",
            f"{monitoring['rows']} labelled predictions stored (SQLite) before the "
            f"service started; measured on {monitoring.get('server', 'a service')}.",
            "",
            "GET /calibration (quiet: the same labels reported again; labels arriving: one new label before "
            "every request):",
            "",
            table(monitoring["calibration"], CALIBRATION_COLUMNS),
            "",
            "POST /feedback:",
            "",
            table([monitoring["feedback"]], ["batch", "labels_per_s", "labels"]),
            "",
        ]
    feedback_load = _load("feedback_load")
    if feedback_load:
        out += [
            "## Feedback load",
            "",
            "Single-row POST /predict, then single-label POST /feedback (each request "
            "labelling a distinct logged prediction), wrk at 32 connections on a fresh service process per store "
            "and round, the stores in turn (bench/feedback_load.py); `stored`: labels found in the store for the "
            "`acknowledged` 2xx responses. A goal is judged on the store's median round.",
            "",
            table(feedback_load["runs"], FEEDBACK_LOAD_COLUMNS),
            "",
        ]
        if all("sync_ratio" in r for r in feedback_load["runs"]):
            out += [
                "Labels that wait for their prediction (single-label /feedback for ids not in the store: every "
                "one stored as pending, piling up), and single-row /predict on a second process with "
                "`CALIB_PREDICTION_LOG_DURABILITY=sync` against the write-behind default of the same round:",
                "",
                table(feedback_load["runs"], DURABILITY_COLUMNS),
                "",
            ]
        out += [*[f"- {line}" for line in feedback_load_goals(feedback_load["runs"])], ""]
    auth = _load("auth")
    if auth:
        at = auth["machine"].get("commit")
        out += [
            "## Token check",
            "",
            f"Single-row POST /predict of the light model, wrk at {auth['connections']} "
            f"connections for {auth['seconds']:g} s, on two service processes in turn: the open default and one "
            "with predict tokens (bench/auth.py)" + (f", measured at commit `{at}`" if at != m["commit"] else "") + ".",
            "",
            table(auth["rows"], AUTH_COLUMNS),
            "",
            *[f"- {line}" for line in auth_goals(auth["rows"], auth.get("check_us"))],
            "",
        ]
    soak = _load("soak")
    if soak:
        out += [
            "## Memory",
            "",
            "The soak server's warm-up runs every request shape of the sweep and of the "
            "heavy rounds (binary v2 too) at its top concurrency, a report of every window measured, 3 s of "
            "feedback batches, then one 20-second round of the steady mixed load (single-row predictions of "
            "both models, a batch of labels, a report); the sweep, the heavy model's rounds, the monitoring "
            "measurements and rounds of that mixed load follow on the same process until the minutes of load "
            "are up.",
            "",
            f"RSS: {soak['after_shapes_rss_mib']:.1f} MiB right after the largest requests (64 clients of "
            f"32-row requests), {soak['warm_rss_mib']:.1f} MiB after the warm-up, "
            f"{soak['end_rss_mib']:.1f} MiB after {soak['minutes']:.1f} minutes of load "
            f"({100 * soak['growth']:+.1f}%).",
            "",
            table(soak["samples"], ["minutes", "rss_mib"]),
            "",
        ]
    if serving:
        out += ["## Goals", "", table(serving["goals"], ["goal", "measured", "target", "met", "note"]), ""]
    out.append(recorded_section())
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
