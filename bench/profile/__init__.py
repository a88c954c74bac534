"""Where the serving process's CPU goes (``python -m bench.profile``, part of ``make bench``): py-spy samples every
thread of the service (on-CPU only) while wrk drives single-row clients at the heavy model through JSON /predict and
binary v2, each sample put in the stage of its innermost frame that names one; with the process's CPU seconds over
the window, each stage's share is CPU ms per request. Just before, without the profiler, the cores are split by
thread from /proc (``cores_by_thread``) for the service and for the batching floor under the same load
(``compared_threads``): what the service's own work costs on the event loop, and the idle it adds at the hand-offs.

    python -m bench.profile [--seconds 10] [--clients 64] [--smoke]
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench.common import HEAVY, Benchmark, children_cpu_seconds, flags, process_cpu_seconds, service, table, warm, wrk
from bench.serving.harness import floor_server, single_row_requests

# (stage, pattern): a sample belongs to the stage of its innermost frame that the pattern matches; py-spy
# names a frame "function (path/to/file.py:line)"
STAGES = [
    (stage, re.compile(pattern))
    for stage, pattern in [
        ("onnxruntime inference", r"onnxruntime|service/serving/runtime\.py"),
        ("scoring: calibrated probabilities, ids", r"service/serving/scoring\.py"),
        ("prediction log writes", r"service/serving/prediction_log\.py|sqlalchemy|service/store/"),
        ("request validation (pydantic)", r"pydantic|^validate \(.*service/http/codec\.py"),
        ("request JSON parse", r"^decode \(.*service/http/codec\.py|/json/|service/http/numeric_json\.py"),
        ("v2 request: header, tensors, checks", r"service/http/v2\.py|^v2_infer \(.*service/serving/dataplane\.py"),
        ("rows to a float32 batch", r"service/serving/preprocessing\.py"),
        ("response body and encoding", r"^respond \(.*service/(serving/dataplane|http/codec)\.py"),
        ("dynamic batcher", r"service/serving/batching\.py"),
        ("metrics and middleware", r"prometheus_client|service/http/middleware\.py|service/metrics\.py"),
        ("HTTP server (uvicorn, starlette)", r"uvicorn|starlette|h11|httptools|fastapi"),
        ("event loop and threads", r"asyncio|threading|concurrent|anyio|selectors"),
    ]
]
OTHER = "other"


def stage_of(frames: list[str]) -> str:
    """The stage of one sample, given its frames outermost first (py-spy's raw format)."""
    for frame in reversed(frames):
        for stage, pattern in STAGES:
            if pattern.search(frame):
                return stage
    return OTHER


def stage_shares(raw: str) -> Counter:
    """Samples per stage from py-spy's raw (collapsed) output: ``frame;frame;... count`` per line."""
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack.split(";")[1:])] += int(count)  # the first entry names the process or thread
    return counts


PROTOCOLS = {"json": "single-row JSON `/predict`", "binary": "single-row v2 infer with binary tensors"}
PY_SPY = shutil.which("py-spy", path=Path(sys.executable).parent) or "py-spy"
EVENT_LOOP, OTHER_THREADS = "event loop (MainThread)", "the service's other threads"


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, for every thread of process ``pid`` (one ``py-spy dump``)."""
    dump = subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump, re.MULTILINE)}


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each live thread of process ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # the thread ended
            out[int(task.name)] = process_cpu_seconds(pid, thread=int(task.name))
    return out


def idle_seconds() -> float:
    """Idle (and I/O wait) seconds of all the machine's cores together (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def cores_by_thread(pid: int, url: str, payload: str | None, clients: int, seconds: float, lua: str | None) -> dict:
    """The machine's cores under ``wrk`` load, without the profiler, by where they went (the event loop, each
    inference thread, other threads, wrk, other processes, idle), and as milliseconds per request."""
    names = thread_names(pid)
    before, idle, client = thread_cpu_seconds(pid), idle_seconds(), children_cpu_seconds()
    started = time.perf_counter()
    load = wrk(url, payload, clients, seconds, lua=lua)
    elapsed = time.perf_counter() - started
    after, idle, client = thread_cpu_seconds(pid), idle_seconds() - idle, children_cpu_seconds() - client
    cores: defaultdict[str, float] = defaultdict(float)
    for tid, cpu in after.items():
        name = names.get(tid, "")
        where = EVENT_LOOP if name == "MainThread" else name if name.startswith("infer-") else OTHER_THREADS
        cores[where] += (cpu - before.get(tid, 0.0)) / elapsed
    cores["wrk"], cores["idle"] = client / elapsed, idle / elapsed
    cores["other processes"] = max(0.0, (os.cpu_count() or 1) - sum(cores.values()))
    rate = load["requests"] / elapsed
    return {
        "requests_per_s": rate,
        "threads": [
            {"where": where, "cores": n, "ms_per_request": 1000 * n / max(rate, 1e-9)} for where, n in cores.items()
        ],
    }


def profile(seconds: float, clients: int, protocol: str, artifacts: Path) -> dict:
    """One protocol's profile (``PROTOCOLS``) on a fresh service process over ``artifacts`` (the heavy model's)."""
    work = Path(tempfile.mkdtemp(prefix="calib-profile-"))
    svc = service(artifacts, f"sqlite:///{work / 'profile.db'}", True, "auto", CALIB_DEFAULT_MODEL=HEAVY)
    floor = floor_server(artifacts / HEAVY / "1" / "model.onnx")
    path, payload, lua = single_row_requests(work)[protocol]
    url = svc.url + path
    try:
        warm(wrk, url, payload, clients, min(seconds, 2.0), lua=lua)
        warm(wrk, floor.url + path, payload, clients, min(seconds, 2.0), lua=lua)
        unprofiled = cores_by_thread(svc.process.pid, url, payload, clients, seconds, lua)
        batching_floor = cores_by_thread(floor.process.pid, floor.url + path, payload, clients, seconds, lua)
        options = {"--pid": svc.process.pid, "--format": "raw", "--rate": 200, "--duration": round(seconds) + 1}
        argv = [PY_SPY, "record", "--nonblocking", "--output", str(work / "raw.txt")]
        argv += [str(part) for option in options.items() for part in option]
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cpu, client_cpu = process_cpu_seconds(svc.process.pid), children_cpu_seconds()
        load = wrk(url, payload, clients, seconds, lua=lua)
        cpu, client_cpu = process_cpu_seconds(svc.process.pid) - cpu, children_cpu_seconds() - client_cpu
        _, errors = spy.communicate(timeout=120)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {errors}")
        counts = stage_shares((work / "raw.txt").read_text())
    finally:
        svc.stop()
        floor.stop()
        shutil.rmtree(work, ignore_errors=True)
    total = sum(counts.values())
    per_request_ms = 1000 * cpu / max(load["requests"], 1)
    stages = [
        {"stage": stage, "share": n / total, "cpu_ms_per_request": per_request_ms * n / total}
        for stage, n in counts.most_common()
    ]
    return {
        "protocol": protocol,
        "model": HEAVY,
        "clients": clients,
        "seconds": seconds,
        "requests_per_s": load["requests_per_s"],
        "server_cpu_ms_per_request": per_request_ms,
        "server_cores_busy": cpu / seconds,
        "client_cores_busy": client_cpu / seconds,
        "samples": total,
        "stages": stages,
        "unprofiled": unprofiled,
        "batching_floor": batching_floor,
        "compared": compared_threads(unprofiled, batching_floor),
    }


INFERENCE_THREADS = "inference threads"


def compared_threads(service_split: dict, floor_split: dict) -> list[dict]:
    """The service's and the batching floor's ``cores_by_thread`` side by side, and what the service adds per
    request."""

    def by_where(split: dict, key: str) -> Counter:
        summed: Counter = Counter()
        for row in split["threads"]:
            summed[INFERENCE_THREADS if row["where"].startswith("infer-") else row["where"]] += row[key]
        return summed

    splits = {"service": service_split, "floor": floor_split}
    cores = {side: by_where(split, "cores") for side, split in splits.items()}
    ms = {side: by_where(split, "ms_per_request") for side, split in splits.items()}
    return [
        {
            "where": where,
            "service_cores": cores["service"][where],
            "floor_cores": cores["floor"][where],
            "service_ms_per_request": ms["service"][where],
            "floor_ms_per_request": ms["floor"][where],
            "added_ms_per_request": ms["service"][where] - ms["floor"][where],
        }
        for where in dict.fromkeys([*cores["service"], *cores["floor"]])
    ]


COLUMNS = ["stage", "share", "cpu_ms_per_request"]
THREAD_COLUMNS = ["where", "cores", "ms_per_request"]
COMPARED_COLUMNS = "where service_cores floor_cores service_ms_per_request floor_ms_per_request added_ms_per_request"


def measure(args) -> dict:
    from training.untrained import untrained_artifact

    seconds, clients = (1.0, 4) if args.smoke else (args.seconds, args.clients)
    protocols = list(PROTOCOLS)[:1] if args.smoke else PROTOCOLS  # a smoke run checks the path, on one protocol
    with tempfile.TemporaryDirectory(prefix="calib-profile-") as work:
        untrained_artifact(Path(work) / "artifacts", HEAVY)
        return {"runs": [profile(seconds, clients, protocol, Path(work) / "artifacts") for protocol in protocols]}


def render(result: dict) -> str:
    """The page's section: per protocol, the stages, the cores by thread, and the service against the batching floor."""
    out = [
        "## Where the server's CPU goes",
        "py-spy samples of every thread of a service process (on-CPU samples, 200 per second) while wrk drives "
        "single-row clients at the heavy model (bench/profile), through each protocol on a fresh process. A "
        "sample counts for the stage of its innermost frame that names one. Of the machine's "
        f"{result['machine']['cores']} cores, what the server and wrk leave is idle.",
    ]
    for run in result["runs"]:
        out += [
            f"{PROTOCOLS[run['protocol']]}, {run['clients']} clients at {run['model']} for "
            f"{run['seconds']:.0f} s: {run['requests_per_s']:.0f} requests/s, "
            f"{run['server_cpu_ms_per_request']:.2f} server CPU ms per request, "
            f"{run['server_cores_busy']:.2f} cores busy in the server and {run['client_cores_busy']:.2f} "
            "in wrk:",
            table(run["stages"], COLUMNS),
        ]
        if run.get("unprofiled"):
            out += [
                f"The same load just before, without the profiler: {run['unprofiled']['requests_per_s']:.0f} "
                "requests/s; the machine's cores by thread (/proc), and as milliseconds per request:",
                table(run["unprofiled"]["threads"], THREAD_COLUMNS),
            ]
        if run.get("compared"):
            out += [
                f"The batching floor (bench/serving/floor_app.py serving the model through the service's batcher, "
                f"nothing else) under the same load: {run['batching_floor']['requests_per_s']:.0f} requests/s; "
                "its cores against the service's, inference threads summed, and what the service adds per "
                "request:",
                table(run["compared"], COMPARED_COLUMNS),
            ]
    return "\n\n".join(out) + "\n"


BENCHMARK = Benchmark(measure, lambda result: [], render, flags(seconds=10.0, clients=64))
