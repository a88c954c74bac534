"""Shared pieces of the benchmarks: machine description, free ports, processes, wrk runs and result files."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import sqlalchemy as sa

from calibkit.synthetic import TrafficShape
from service.ports import free_port
from training.machine import hardware

ROOT = Path(__file__).resolve().parents[1]
LIGHT, HEAVY = "digits-lenet5", "cifar-resnet56"
#: The calibrated synthetic traffic of the benchmarks: 10 classes, logits N(0, 2.5^2), confidences over [0.2, 1].
CIFAR_LIKE = TrafficShape("cifar-like", 10, 2.5)
GPU_MAX_BATCH = 256  # the batcher's largest batch on a GPU (64 on CPUs, where larger batches gain nothing)
# BENCH_RESULTS_DIR moves the JSON results elsewhere (the tests point it at a temporary directory)
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or ROOT / "bench" / "results")
#: The client of the benchmarks' and the tests' loopback servers: httpx.get builds a TLS context per call. Like it,
#: it keeps no connection between calls, so a server restarted on a port is met afresh.
loopback = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def machine() -> dict:
    """What the numbers were measured on (the machine, its GPU, the Python and numpy versions) and at which commit."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout
    except OSError:  # no git (a copied tree on another machine)
        commit = ""
    return hardware() | {
        "gpu": gpu_name(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "commit": commit.strip() or None,
    }


def measured_by(command: str, m: dict, seconds: float | None = None) -> str:
    """The opening of a page: the command, the machine ``m`` (``machine()``), the commit, and the run's seconds."""
    return (
        f'Measured by `{command}` on {m["cores"]} cores of "{m["cpu"]}" ({m["isa"]}), {m["memory_gib"]} GiB, '
        f"{m.get('gpu') or 'no GPU'}, Python {m['python']}, numpy {m.get('numpy')}, at commit `{m['commit']}`"
        + (f", in {seconds:.0f} s." if seconds is not None else ".")
    )


def gpu_name() -> str | None:
    """The first NVIDIA GPU's name (nvidia-smi), None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def v2_binary_request(rows: np.ndarray, outputs: tuple[str, ...] = ("probabilities",)) -> tuple[bytes, int]:
    """The body of a binary-tensor v2 inference as tritonclient.http builds it, built here so that no client library
    is needed (tests/bench/test_gpu_run.py holds the two equal), and the header's length."""
    x = np.ascontiguousarray(rows, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
        },
        separators=(",", ":"),
    ).encode()
    return header + x.tobytes(), len(header)


#: The PostgreSQL whose database a benchmark may create and drop one of its own in (the test suite points it at its
#: throwaway server).
PG_ADMIN_URL = os.environ.get("CALIB_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def store_url(store: str, work: Path | None = None) -> Iterator[str]:
    """The service's database URL: an SQLite file in ``work``, or a fresh PostgreSQL database."""
    if store == "sqlite":
        assert work is not None, "an SQLite store is a file in work"
        yield f"sqlite:///{work / 'store.db'}"
        return
    if store != "postgresql":
        raise ValueError(f"store is sqlite or postgresql, not {store!r}")
    name = f"calib_bench_{uuid.uuid4().hex[:12]}"
    with connection(PG_ADMIN_URL, isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with connection(PG_ADMIN_URL, isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def connection(url: str, begin: bool = False, **options) -> Iterator[sa.Connection]:
    """A connection to the database at ``url`` (in one transaction with ``begin``), its engine disposed after."""
    engine = sa.create_engine(url, **options)
    try:
        with engine.begin() if begin else engine.connect() as c:
            yield c
    finally:
        engine.dispose()


def write_result(name: str, data: dict, smoke: bool = False) -> Path:
    """bench/results/<name>.json, or under $BENCH_RESULTS_DIR (smoke runs write <name>-smoke.json and never replace
    real results)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'-smoke' if smoke else ''}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2, default=str))
    return path


def load_result(name: str) -> dict | None:
    """The stored result of benchmark ``name`` (bench/results/<name>.json), None before its first run."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(rows: list[dict], columns: str | list[str]) -> str:
    """A markdown table of ``rows`` with the given columns (a string: the column names, space-separated)."""
    columns = columns.split() if isinstance(columns, str) else columns

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def progress(row: dict, columns: str | list[str]) -> dict:
    """``row``, printed as it comes: its line of a markdown ``table`` of ``columns``."""
    print(table([row], columns).splitlines()[-1], flush=True)
    return row


GOAL_COLUMNS = "goal measured target met note".split()
"""The columns of goal rows that ``judged`` judges."""
CHECKED_COLUMNS = "goal rows met worst".split()
"""The columns of goal rows checked on many rows at once (``checked``): how many, whether all meet it, and the worst."""
Side = TypeVar("Side", bound=Hashable)
Measured = TypeVar("Measured")
_CHECKS = {">=": lambda v, b: v >= b, "<=": lambda v, b: v <= b, "within": lambda v, b: abs(v) <= b}


def clopper_pearson(hits: int, n: int, level: float = 0.95) -> list[float]:
    """The exact binomial interval of a share ``hits`` / ``n`` (Clopper & Pearson 1934)."""
    from scipy import stats

    tail = (1 - level) / 2
    low = float(stats.beta.ppf(tail, hits, n - hits + 1)) if hits > 0 else 0.0
    high = float(stats.beta.ppf(1 - tail, hits + 1, n - hits)) if hits < n else 1.0
    return [low, high]


def goal(name: str, measured: float, target: str, note: str = "") -> dict:
    """A goal row: its ``name``, the ``measured`` value and its ``target``, which ``judged`` judges."""
    return {"goal": name, "measured": measured, "target": target, "note": note}


def many(name: str, rows: int, met: bool | str, worst: str | None) -> dict:
    """A goal row checked on many ``rows`` at once (``CHECKED_COLUMNS``)."""
    return {"goal": name, "rows": rows, "met": met, "worst": worst}


def judged(rows: list[dict]) -> list[dict]:
    """Goal rows of ``measured`` against ``target``: ">= x", "<= x", "within x" set ``met`` to whether it holds; any
    other target (such as "reported") is copied to ``met``. ``note`` defaults to empty."""
    for row in rows:
        op, _, bound = row["target"].partition(" ")
        row["met"] = _CHECKS[op](row["measured"], float(bound)) if op in _CHECKS else row["target"]
        row.setdefault("note", "")
    return rows


def checked(
    name: str,
    rows: list[dict],
    key: str | Callable[[dict], float],
    target: str,
    where: Callable[[dict], str],
    fmt: str = "{:.4f}",
    more: Callable[[dict], str] = lambda worst: "",
) -> dict:
    """A goal on many ``rows`` at once: every row's ``key`` (a column, or a function of the row) against ``target``;
    how many met it, and the worst (``fmt`` of its value, ``where`` it is, and ``more`` of it)."""
    if not rows:
        return many(name, 0, "not measured", "")
    value = key if callable(key) else (lambda r: r[key])
    op, _, bound = target.partition(" ")
    check = functools.partial(_CHECKS[op], b=float(bound))
    worst = (min if op == ">=" else max)(rows, key=lambda r: abs(value(r)) if op == "within" else value(r))
    met = sum(bool(check(value(r))) for r in rows)
    shown = f"{fmt.format(value(worst))} ({where(worst)}); {met} of {len(rows)} rows met{more(worst)}"
    return many(name, len(rows), met == len(rows), shown)


def warm(load: Callable[..., object], *args, **kwargs) -> None:
    """A discarded load to a steady state, skipped in a smoke run (BENCH_SMOKE, from --smoke), which checks paths."""
    if not os.environ.get("BENCH_SMOKE"):
        load(*args, **kwargs)


def ab_rounds(
    sides: Sequence[Side],
    rounds: int,
    measure: Callable[[Side, int], Measured],
    warm_up: Callable[[Side], object] | None = None,
    rotate: bool = False,
) -> list[dict[Side, Measured]]:
    """Alternating rounds, so that a drift of the machine's speed hits every side alike: a discarded
    ``warm_up(side)`` each, then ``rounds`` rounds of ``measure(side, round)``, reversed every other round
    (``rotate``: rotated)."""
    if warm_up is not None:
        for side in sides:
            warm(warm_up, side)
    out = []
    for i in range(rounds):
        turn = i % len(sides)
        order = [*sides[turn:], *sides[:turn]] if rotate else (sides if i % 2 == 0 else sides[::-1])
        out.append({side: measure(side, i) for side in order})
    return out


class Server:
    """A server process (``argv`` gets ``--port``), ready at a URL or a port ``probe``; stopped by ``with``."""

    def __init__(
        self,
        argv: list[str],
        ready_path: str | None,
        env: dict | None = None,
        cwd: Path = ROOT,
        output: Path | None = None,
        probe: Callable[[int], bool] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sink = output.open("wb") if output is not None else subprocess.DEVNULL
        # one string-hash seed for every server, so that processes compared differ only in what is compared
        # (dict and set layouts, hence their speed, otherwise differ from process to process)
        self.process = subprocess.Popen(
            [*argv, "--port", str(self.port)],
            env=dict(os.environ, PYTHONHASHSEED="0", **(env or {})),
            cwd=cwd,
            stdout=sink,
            stderr=subprocess.STDOUT if output else sink,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if probe is not None:
                    ready = probe(self.port)
                else:
                    assert ready_path is not None, "a server without a probe has a readiness path"
                    ready = self.get(ready_path).status_code == 200
                if ready:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        code = self.process.poll()
        self.stop()
        raise RuntimeError(f"{argv} " + ("did not become ready" if code is None else f"exited with status {code}"))

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def rss_mib(self) -> float:
        return rss_mib(self.process.pid)

    def get(self, path: str) -> httpx.Response:
        return loopback.get(self.url + path)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def interrupt(self) -> None:
        """Stop a launcher that writes its results on Ctrl-C (py-spy), then the server it started, which outlives it."""
        children = [
            int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if parent_pid(stat) == self.process.pid
        ]
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def parent_pid(stat: Path) -> int | None:
    """The parent's pid in a ``/proc/<pid>/stat`` file (field 4, after the parenthesised command name)."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60_000.0}
#: A smoke run's wrk threads stop after 100 responses: its loads check paths; the service idles while wrk waits it out.
SMOKE_STOP = "\nlocal n = 0\nfunction response() n = n + 1 if n >= 100 then wrk.thread:stop() end end\n"


def wrk(url: str, body: str | None, connections: int, seconds: float, lua=None, threads=1, warmed=False) -> dict:
    """``connections`` closed-loop clients for ``seconds``: POST ``body`` or run ``lua`` (``warmed``: after ``warm``)"""
    if warmed:
        warm(wrk, url, body, connections, 1.0, lua, threads)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        if lua is None:
            assert body is not None, "wrk posts the body where no Lua script builds the requests"
            body_file = Path(tmp) / "body.json"
            body_file.write_text(body)
            lua = (
                f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                f'wrk.body = io.open("{body_file}"):read("*a")\n'
            )
        script.write_text(lua + (SMOKE_STOP if os.environ.get("BENCH_SMOKE") else ""))
        load = [f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "30s"]
        argv = ["wrk", *load, "--latency", "-s", str(script), url]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    def latency(pct: str) -> float:
        found = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.MULTILINE)
        if found is None:
            return float("nan")
        value, unit = found.groups()
        return float(value) * _UNITS[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    rate, requests = re.search(r"Requests/sec:\s+([\d.]+)", out), re.search(r"(\d+) requests in", out)
    assert rate is not None and requests is not None, f"wrk printed no summary:\n{out}"
    return {
        "requests_per_s": float(rate.group(1)),
        "requests": int(requests.group(1)),
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1).strip() if socket_errors else "",
    }


def histogram_totals(url: str) -> dict[str, list[float]]:
    """(sum, count) of the service's own histograms: the /predict phases and request time, and per model the queue,
    inference and batch size and a pod's front-end messages to its engine (``round``, ``message``)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(loopback.get(f"{url}/metrics").text):
        for sample in family.samples:
            if not sample.name.endswith(("_sum", "_count")):
                continue
            labels = sample.labels
            if family.name == "calib_request_phase_duration_seconds" and labels.get("route") == "/predict":
                key = labels["phase"]
            elif family.name in (
                "calib_queue_duration_seconds",
                "calib_inference_duration_seconds",
                "calib_batch_size_rows",
            ):
                key = f"{family.name.removeprefix('calib_').split('_')[0]}:{labels['model'].split(':')[0]}"
            elif family.name in ("calib_engine_round_trip_seconds", "calib_engine_message_rows"):
                key = f"{family.name.split('_')[2]}:{labels['model'].split(':')[0]}"  # round, message
            elif family.name == "calib_http_request_duration_seconds" and labels.get("route") == "/predict":
                key = "total"
            else:
                continue
            totals.setdefault(key, [0.0, 0.0])[0 if sample.name.endswith("_sum") else 1] += sample.value
    return totals


def metric_samples(url: str, name: str) -> list:
    """The samples named ``name`` in the service's /metrics at ``url`` (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(loopback.get(f"{url}/metrics").text)
    return [sample for family in families for sample in family.samples if sample.name == name]


def histogram_means(before: dict, after: dict, keys: list[str]) -> dict:
    """Mean per observation of each histogram between two ``histogram_totals`` snapshots."""
    out = {}
    for key in keys:
        s0, c0 = before.get(key, [0.0, 0.0])
        s1, c1 = after.get(key, [0.0, 0.0])
        out[key] = (s1 - s0) / (c1 - c0) if c1 > c0 else None
    return out


def process_cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` or its thread ``thread`` (/proc stat fields 14, 15)."""
    stat = Path(f"/proc/{pid}" + (f"/task/{thread}" if thread is not None else "") + "/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the fields after the command name, from field 3 on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a pod's engine and front-ends)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (wrk runs, for one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


PYTHON = sys.executable


def service(
    artifacts: Path,
    database_url: str,
    log: bool = True,
    device: str = "cpu",
    output: Path | None = None,
    ready_path: str = "/v2/health/ready",
    cwd: Path = ROOT,
    launcher: Sequence[str] = (),
    argv: Sequence[str] = (PYTHON, "-m", "service"),
    **env: str,
) -> Server:
    """The service (``argv``, behind a ``launcher`` such as a profiler) over ``artifacts`` on ``device``, run from
    ``cwd`` with its store at ``database_url`` and ``env`` on top, once ``ready_path`` answers 200."""
    env = (
        {
            "CALIB_ARTIFACTS": str(artifacts),
            "CALIB_STORE__URL": database_url,
            "CALIB_LOG_LEVEL": "warning",
            "CALIB_GRPC_PORT": "0",
            "CALIB_PREDICTION_LOG__ENABLED": "true" if log else "false",
            "CALIB_DEFAULT_MODEL": LIGHT,
            "CALIB_DEVICE": device,
        }
        | ({"CALIB_BATCHING__MAX_BATCH_SIZE": str(GPU_MAX_BATCH)} if device == "cuda" else {})
        | env
    )
    return Server([*launcher, *argv], ready_path, env, cwd=cwd, output=output)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's steps: ``measure(args)`` (None for a mode that writes its own output), ``goals(result)``,
    ``render(result)`` (markdown), and ``arguments(parser)``, its own flags."""

    measure: Callable[[argparse.Namespace], dict | None]
    goals: Callable[[dict], list]
    render: Callable[[dict], str]
    arguments: Callable[[argparse.ArgumentParser], None] = field(default=lambda parser: None)


def flags(**defaults: object) -> Callable[[argparse.ArgumentParser], None]:
    """A benchmark's ``arguments``: a flag ``--name`` per keyword (underscores as dashes), typed as its default, or
    ``(default, help)``, or ``(default, help, type)``; a default of False makes a switch."""

    def add(parser: argparse.ArgumentParser) -> None:
        for name, value in defaults.items():
            default, text, *parse = value if isinstance(value, tuple) else (value, None)
            kind: dict = {"type": parse[0] if parse else type(default), "default": default}
            if default is False:
                kind = {"action": "store_true"}
            parser.add_argument(f"--{name.replace('_', '-')}", help=text, **kind)

    return add


def digits_model(normalized: bool = False, artifact: Path = ROOT / "artifacts" / LIGHT / "1") -> Callable:
    """The committed model's (or ``artifact``'s) ``probabilities`` on the CPU in float64, rows ``normalized``."""
    import onnxruntime as ort

    manifest = json.loads((artifact / "manifest.json").read_text())
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    output, name = manifest["outputs"]["probabilities"], manifest["input"]["name"]

    def probs(x: np.ndarray) -> np.ndarray:
        p = session.run([output], {name: x.astype(np.float32)})[0].astype(np.float64)
        return p / p.sum(axis=1, keepdims=True) if normalized else p

    return probs


def save_stage(path: Path, result: dict, stage: str, started: float) -> None:
    """A device run's result written after each stage, so that a run cut short still returns what it measured."""
    result["stages_done"] = [*result.get("stages_done", []), stage]
    result["minutes"] = (time.monotonic() - started) / 60
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"[{result['minutes']:.1f} min] {stage}", flush=True)
