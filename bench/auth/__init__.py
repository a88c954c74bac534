"""Token check benchmark (``python -m bench.auth``, part of ``make bench``): single-row POST /predict of the light
model with predict tokens on against the open default, two service processes under wrk in alternating rounds:
requests/s, p99, and the median ratio tokens/open with its range (goal: at least 0.97). Rounds on a shared machine
drift by more than that, so the check itself is also timed in process, as a share of the open server's time per
request.

    python -m bench.auth [--seconds 5] [--rounds 7] [--smoke]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import GOAL_COLUMNS, ROOT, Benchmark, ab_rounds, flags, goal, judged, service, table, wrk

MODEL = "digits-lenet5"
CONNECTIONS = 32
GOAL_RATIO = 0.97
TOKEN = "bench-token-0123456789abcdef0123456789abcdef"
COLUMNS = ["round", "open_rps", "tokens_rps", "ratio", "open_p99_ms", "tokens_p99_ms"]
_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
wrk.body = io.open("{body}"):read("*a")
"""


def measure_rounds(seconds: float, rounds: int) -> list[dict]:
    """``rounds`` alternating rounds (``ab_rounds``) of single-row /predict on the open and the guarded process."""
    from training.data import load_digits_splits

    work = Path(tempfile.mkdtemp(prefix="calib-bench-auth-"))
    body = work / "body.json"
    body.write_text(json.dumps({"inputs": load_digits_splits().test.x[:1].tolist()}))
    tokens = f"other:{TOKEN[::-1]},bench:{TOKEN}"
    servers = {
        "open": service(ROOT / "artifacts", f"sqlite:///{work / 'open.db'}"),
        "tokens": service(ROOT / "artifacts", f"sqlite:///{work / 'tokens.db'}", CALIB_AUTH__PREDICT_TOKENS=tokens),
    }
    lua = _LUA.format(token=TOKEN, body=body)

    def load(name: str, _round: int, seconds: float = seconds) -> dict:
        run = wrk(f"{servers[name].url}/predict", None, CONNECTIONS, seconds, lua=lua)
        assert run["non_2xx"] == 0, run
        return run

    try:
        measured = ab_rounds(("open", "tokens"), rounds, load, lambda name: load(name, 0, 1.0))
        return [
            {
                "round": i + 1,
                "open_rps": runs["open"]["requests_per_s"],
                "tokens_rps": runs["tokens"]["requests_per_s"],
                "ratio": runs["tokens"]["requests_per_s"] / runs["open"]["requests_per_s"],
                "open_p99_ms": runs["open"]["p99_ms"],
                "tokens_p99_ms": runs["tokens"]["p99_ms"],
            }
            for i, runs in enumerate(measured)
        ]
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def check_seconds(repeats: int = 200_000) -> float:
    """Seconds per token check as the middleware runs it on a guarded /predict (route group, then both tokens)."""
    from pydantic import SecretStr

    from service.app import create_app
    from service.auth import AccessControl
    from service.http.routes import RouteAccess
    from service.settings import AuthSettings, Settings

    settings = Settings(auth=AuthSettings(predict_tokens=SecretStr(f"other:{TOKEN[::-1]},bench:{TOKEN}")))
    access, groups = AccessControl(settings), RouteAccess.of_app(create_app(settings))
    header = f"Bearer {TOKEN}"
    start = time.perf_counter()
    for _ in range(repeats):
        group = groups.of("/predict")
        if group is not None and group != "open":
            access.check(group, header)
    return (time.perf_counter() - start) / repeats


def goals(result: dict) -> list[dict]:
    """The tokens' requests/s over the open default's on the median round, beside the check's own cost."""
    rows, check_us = result["rows"], result["check_us"]
    ratios = sorted(r["ratio"] for r in rows)
    per_request = 1e6 / sorted(r["open_rps"] for r in rows)[len(rows) // 2]
    note = (
        f"{len(rows)} rounds, {ratios[0]:.3f}-{ratios[-1]:.3f}; the check alone: {check_us:.2f} us per request, "
        f"{100 * check_us / per_request:.2f}% of the open server's {per_request:.0f} us per request (its median round)"
    )
    name = "light /predict with predict tokens: requests/s over the open default's, median round"
    return judged([goal(name, ratios[len(ratios) // 2], f">= {GOAL_RATIO}", note)])


def measure(args) -> dict:
    seconds, rounds = (1.0, 1) if args.smoke else (args.seconds, args.rounds)
    rows = measure_rounds(seconds, rounds)
    check_us = 1e6 * check_seconds(20_000 if args.smoke else 200_000)
    return {"connections": CONNECTIONS, "seconds": seconds, "rows": rows, "check_us": check_us}


def render(result: dict) -> str:
    return "\n".join(
        [
            "## Token check",
            "",
            f"Single-row POST /predict of the light model, wrk at {result['connections']} "
            f"connections for {result['seconds']:g} s, on two service processes in turn: the open default and one "
            "with predict tokens (bench/auth).",
            "",
            table(result["rows"], COLUMNS),
            "",
            table(result["goals"], GOAL_COLUMNS),
            "",
        ]
    )


BENCHMARK = Benchmark(measure, goals, render, flags(seconds=5.0, rounds=7))
