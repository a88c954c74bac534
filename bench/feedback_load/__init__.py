"""Feedback load benchmark (``python -m bench.feedback_load``, part of ``make bench``): single-label POST /feedback
next to single-row POST /predict, on SQLite and on a fresh PostgreSQL database of ``CALIB_BENCH_DATABASE_URL``.

Per store and round, one service under wrk: (a) single-row /predict; (b) single-label /feedback of predictions made
beforehand; (c) the same for ids whose prediction is not stored yet (every label waits as pending); then under sync
durability, (d) single-row /predict, the cost of durable ids against (a). Every acknowledged label must be stored:
the labels found against wrk's 2xx responses and the service's own count.

    python -m bench.feedback_load [--seconds 10] [--rounds 3] [--stores sqlite postgresql] [--smoke]
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from bench.common import (
    GOAL_COLUMNS,
    ROOT,
    Benchmark,
    ab_rounds,
    connection,
    goal,
    judged,
    metric_samples,
    service,
    store_url,
    table,
    wrk,
)

CONNECTIONS = 32
GOAL_RATIO = 0.25
GOAL_P99_MS = 100.0
WARMUP_SECONDS = 1.0
COLUMNS = (
    "store round predict_rps feedback_rps ratio feedback_p50_ms feedback_p99_ms predict_p99_ms acknowledged "
    "answered_2xx stored non_2xx"
).split()
DURABILITY_COLUMNS = (
    "store round pending_feedback_rps pending_feedback_p99_ms pending_stored predict_rps sync_predict_rps "
    "sync_ratio predict_p99_ms sync_predict_p99_ms"
).split()

_FEEDBACK_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local bodies, i = {{}}, 0
for line in io.lines("{ids}") do
  local id, label = line:match("(%S+) (%S+)")
  bodies[#bodies + 1] = '{{"items":[{{"prediction_id":"' .. id .. '","label":' .. label .. '}}]}}'
end
request = function()
  i = i + 1
  if i > #bodies then
    wrk.thread:stop()
    i = #bodies
  end
  return wrk.format(nil, nil, nil, bodies[i])
end
"""


def count_labels(url: str, table: str = "labels") -> int:
    with connection(url) as c:
        return c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()


def unknown_ids(n: int) -> list[tuple[str, int]]:
    """``n`` (prediction id, label) pairs of ids made now that no prediction has: their labels wait as pending."""
    from service.store.rows import prediction_ids

    return [(i, k % 10) for k, i in enumerate(prediction_ids(n))]


def predicted_ids(base: str, n: int) -> list[tuple[str, int]]:
    """``n`` (prediction id, true label) pairs from /predict on the digits test split, once the log has written them."""
    from training.data import load_digits_splits

    test = load_digits_splits().test
    out: list[tuple[str, int]] = []
    with httpx.Client(base_url=base, timeout=120) as client:
        while len(out) < n:
            idx = np.arange(len(out), len(out) + min(1024, n - len(out))) % len(test.y)
            body = client.post("/predict", json={"inputs": test.x[idx].tolist()})
            body.raise_for_status()
            out += [(p["id"], int(test.y[i])) for p, i in zip(body.json()["predictions"], idx)]
        deadline = time.monotonic() + 60
        while client.get("/health").json()["storage"]["prediction_log_pending"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the prediction log was not written within 60 s")
            time.sleep(0.1)
    return out


def answered(base: str) -> int:
    """2xx responses the service has sent to POST /feedback (its own counter)."""
    samples = metric_samples(base, "calib_http_requests_total")
    return int(sum(s.value for s in samples if s.labels["route"] == "/feedback" and s.labels["status"][0] == "2"))


def settle(base: str, timeout: float = 30.0) -> None:
    """Wait until the service has answered everything wrk left in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric_samples(base, "calib_http_requests_in_flight")[0].value <= 1:  # this request
            return
        time.sleep(0.1)


def feedback_run(base: str, ids: list[tuple[str, int]], seconds: float, tmp: Path) -> dict:
    """wrk's single-label /feedback of ``ids``, each once, then the wait for what it left in flight (``settle``)."""
    path = tmp / f"ids-{uuid.uuid4().hex[:8]}.txt"
    path.write_text("".join(f"{i} {label}\n" for i, label in ids))
    run = wrk(f"{base}/feedback", None, CONNECTIONS, seconds, lua=_FEEDBACK_LUA.format(ids=path))
    settle(base)
    return run


def store_round(store: str, seconds: float, smoke: bool) -> dict:
    """Single-row /predict and single-label /feedback at 32 connections on one service process."""
    from training.data import load_digits_splits

    with tempfile.TemporaryDirectory(prefix="calib-bench-feedback-") as tmp, store_url(store, Path(tmp)) as url:
        with service(ROOT / "artifacts", url) as server:
            predict_body = json.dumps({"inputs": load_digits_splits().test.x[:1].tolist()})
            wrk(f"{server.url}/predict", predict_body, CONNECTIONS, WARMUP_SECONDS)
            predict = wrk(f"{server.url}/predict", predict_body, CONNECTIONS, seconds)
            # enough distinct ids for feedback as fast as /predict, twice over, and the warm-up
            warmup_n = int(max(predict["requests_per_s"], 1000) * WARMUP_SECONDS * 2)
            main_n = int(max(predict["requests_per_s"], 1000) * (seconds + 1) * 2)
            ids = predicted_ids(server.url, warmup_n + main_n)
            feedback_run(server.url, ids[:warmup_n], WARMUP_SECONDS, Path(tmp))
            before, answered_before = count_labels(url), answered(server.url)
            feedback = feedback_run(server.url, ids[warmup_n:], seconds, Path(tmp))
            stored, served = count_labels(url) - before, answered(server.url) - answered_before
            pending = feedback_run(server.url, unknown_ids(main_n), seconds, Path(tmp))
            pending_stored = count_labels(url, "pending_labels")
        with service(ROOT / "artifacts", url, CALIB_PREDICTION_LOG__DURABILITY="sync") as sync_server:
            wrk(f"{sync_server.url}/predict", predict_body, CONNECTIONS, WARMUP_SECONDS)
            sync_predict = wrk(f"{sync_server.url}/predict", predict_body, CONNECTIONS, seconds)
    acknowledged = feedback["requests"] - feedback["non_2xx"]
    return {
        "store": store,
        "seconds": seconds,
        "smoke": smoke,
        "connections": CONNECTIONS,
        "predict": predict,
        "feedback": feedback,
        "predict_rps": predict["requests_per_s"],
        "feedback_rps": feedback["requests_per_s"],
        "ratio": feedback["requests_per_s"] / predict["requests_per_s"],
        "feedback_p50_ms": feedback["p50_ms"],
        "feedback_p99_ms": feedback["p99_ms"],
        "predict_p99_ms": predict["p99_ms"],
        "acknowledged": acknowledged,
        "answered_2xx": served,
        "stored": stored,
        "non_2xx": feedback["non_2xx"],
        "ids_prepared": main_n,
        "ids_ran_out": feedback["requests"] + CONNECTIONS >= main_n,
        "every_acknowledged_label_stored": stored >= acknowledged and stored == served,
        "pending_feedback": pending,
        "pending_feedback_rps": pending["requests_per_s"],
        "pending_feedback_p99_ms": pending["p99_ms"],
        "pending_stored": pending_stored,
        "every_pending_label_stored": pending_stored >= pending["requests"] - pending["non_2xx"],
        "sync_predict": sync_predict,
        "sync_predict_rps": sync_predict["requests_per_s"],
        "sync_predict_p99_ms": sync_predict["p99_ms"],
        "sync_ratio": sync_predict["requests_per_s"] / predict["requests_per_s"],
    }


def measure_rounds(stores: list[str], seconds: float, rounds: int, smoke: bool) -> list[dict]:
    """``store_round`` of every store in alternating rounds (``ab_rounds``)."""
    measured = ab_rounds(stores, rounds, lambda store, i: store_round(store, seconds, smoke) | {"round": i + 1})
    return [run for runs in measured for run in runs.values()]


def goals(result: dict) -> list[dict]:
    """Per store, the goals on its median round (by feedback p99; of an even number, the slower middle one) with the
    range over rounds, and whether every round stored every acknowledged label."""
    out = []
    for store in dict.fromkeys(r["store"] for r in result["runs"]):
        runs = sorted((r for r in result["runs"] if r["store"] == store), key=lambda r: r["feedback_p99_ms"])
        median = runs[len(runs) // 2]

        def spread(key: str, runs=runs) -> str:
            values = sorted(x[key] for x in runs)
            return f"{len(runs)} rounds, {values[0]:.3g}-{values[-1]:.3g}"

        ran_out = "; the ids ran out before the end (wrk stopped early: requests/s is too low)"
        out += [
            goal(
                f"{store}: single-label feedback requests/s over single-row predict's, median round",
                median["ratio"],
                f">= {GOAL_RATIO}",
                spread("ratio") + (ran_out if any(x["ids_ran_out"] for x in runs) else ""),
            ),
            goal(
                f"{store}: feedback p99 ms, median round",
                median["feedback_p99_ms"],
                f"<= {GOAL_P99_MS:g}",
                spread("feedback_p99_ms"),
            ),
            goal(
                f"{store}: rounds with an acknowledged label not stored",
                sum(not x["every_acknowledged_label_stored"] for x in runs),
                "<= 0",
                f"{sum(x['stored'] for x in runs)} labels stored for {sum(x['acknowledged'] for x in runs)} "
                f"2xx received by wrk and {sum(x['answered_2xx'] for x in runs)} sent by the service",
            ),
        ]
        if "pending_feedback_p99_ms" not in median:
            continue
        pending = sorted(x["pending_feedback_p99_ms"] for x in runs)
        sync = sorted(x["sync_ratio"] for x in runs)
        out += [
            goal(
                f"{store}: feedback p99 ms when every label waits for its prediction (pending), median round",
                pending[len(pending) // 2],
                f"<= {GOAL_P99_MS:g}",
                spread("pending_feedback_p99_ms")
                + ("" if all(x["every_pending_label_stored"] for x in runs) else "; NOT every pending label stored"),
            ),
            goal(
                f"{store}: single-row predict requests/s with sync durability over the write-behind default's",
                sync[len(sync) // 2],
                "reported",
                spread("sync_ratio") + "; no goal: the price of durable ids",
            ),
        ]
    return judged(out)


def arguments(parser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", nargs="*", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])


def measure(args) -> dict:
    seconds, rounds = (1.0, 1) if args.smoke else (args.seconds, args.rounds)
    return {"runs": measure_rounds(args.stores, seconds, rounds, args.smoke)}


def render(result: dict) -> str:
    out = [
        "## Feedback load",
        "",
        "Single-row POST /predict, then single-label POST /feedback (each request "
        "labelling a distinct logged prediction), wrk at 32 connections on a fresh service process per store "
        "and round, the stores in turn (bench/feedback_load); `stored`: labels found in the store for the "
        "`acknowledged` 2xx responses. A goal is judged on the store's median round.",
        "",
        table(result["runs"], COLUMNS),
        "",
    ]
    if all("sync_ratio" in r for r in result["runs"]):
        out += [
            "Labels that wait for their prediction (single-label /feedback for ids not in the store: every "
            "one stored as pending, piling up), and single-row /predict on a second process with "
            "`CALIB_PREDICTION_LOG__DURABILITY=sync` against the write-behind default of the same round:",
            "",
            table(result["runs"], DURABILITY_COLUMNS),
            "",
        ]
    return "\n".join([*out, table(result["goals"], GOAL_COLUMNS), ""])


BENCHMARK = Benchmark(measure, goals, render, arguments)
