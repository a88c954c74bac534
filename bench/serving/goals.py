"""The serving benchmark's goals, each a ratio or a difference measured within one run, with its target; the
heavy model's are those of the device it really ran on."""

from __future__ import annotations

from bench.serving.measure import CUDA, HEAVY, LIGHT


def _find(records, **match):
    return next(r for r in records if all(r[k] == v for k, v in match.items()))


def goals(result: dict, top: int, calibration: list[dict], feedback: dict, memory: dict) -> list[dict]:
    """Every goal whose measurements this run made (a smoke run makes only some); the heavy model's
    batching and latency goals are those of the device it ran on."""
    out = []
    for goal in (_batching_goals, _latency_goal, _queue_delay_goal, _logging_goals):
        try:
            out += goal(result, top)
        except StopIteration:
            continue
    out.append(
        {"goal": "feedback labels/s (batches of 1000)", "measured": feedback["labels_per_s"], "target": ">= 5000"}
    )
    worst = max(calibration, key=lambda r: r["p99_ms"])
    out.append(
        {
            "goal": "GET /calibration p99 ms, worst window (quiet or while labels arrive)",
            "measured": worst["p99_ms"],
            "target": "<= 50",
            "note": f"window {worst['window']}, labels arriving: {worst['labels_arriving']}",
        }
    )
    out.append(
        {
            "goal": f"RSS change after {memory['minutes']:.1f} minutes of load, relative to after the warm-up",
            "measured": memory["growth"],
            "target": "within 0.05",
        }
    )
    for row in out:
        value, target = row["measured"], row["target"]
        op, bound = target.split()[0], float(target.split()[1])
        row["met"] = {">=": value >= bound, "<=": value <= bound, "within": abs(value) <= bound}[op]
        row.setdefault("note", "")
    return out


def _batching_goals(result: dict, top: int) -> list[dict]:
    """On a CPU: the service within 10% of onnxruntime alone at the batch it formed, through JSON and
    binary v2. On a GPU: at least 0.8 of onnxruntime alone and 3 times the no-batching baseline."""
    load, heavy, out = result["load"], result["heavy_rounds"], []
    gpu = result["providers"][HEAVY] == CUDA
    rounds = f"median of {len(heavy['rounds'])} rounds, each measuring every side in turn"
    for side, name in (
        ("json", "JSON /predict"),
        ("binary", "v2 binary tensors (tritonclient.http's body)"),
        ("grpc", "gRPC ModelInfer with raw tensor contents"),
    ):
        r = heavy[f"{side}_vs_raw"]
        floor = (
            f"; the bare grpcio batching floor reached {r['grpc_batching_floor_vs_raw']:.3f}" if side == "grpc" else ""
        )
        out.append(
            {
                "goal": f"heavy on {result['providers'][HEAVY]}: service rows/s at {top} single-row clients "
                f"through {name} / onnxruntime alone at the batch size the batcher formed",
                "measured": r[f"{side}_vs_raw"],
                "target": ">= 0.8" if gpu else ">= 0.9",
                "note": f"{rounds}; this round: {r[f'{side}_rows_per_s']:.0f} vs {r[f'raw_{side}_rows_per_s']:.0f} "
                f"rows/s at {round(r[f'{side}_batch'])} rows (mean batch {r[f'{side}_batch']:.1f}){floor}",
            }
        )
    if gpu:
        r = heavy["json_vs_baseline"]
        out.append(
            {
                "goal": f"heavy on {CUDA}: service / no-batching baseline at {top} clients",
                "measured": r["json_vs_baseline"],
                "target": ">= 3",
                "note": f"{rounds}; this round: {r['json_rows_per_s']:.0f} vs {r['baseline_rows_per_s']:.0f} rows/s",
            }
        )
    light_svc = _find(load, server="service", model=LIGHT, rows=1, clients=top)
    light_base = _find(load, server="baseline", model=LIGHT, rows=1, clients=top)
    out.append(
        {
            "goal": f"light: service requests/s / baseline at {top} clients",
            "measured": light_svc["requests_per_s"] / light_base["requests_per_s"],
            "target": ">= 1.5",
        }
    )
    return out


def _latency_goal(result: dict, top: int) -> list[dict]:
    """p50 at one client over raw single-row inference: the light model (HTTP dominates) everywhere,
    and on a GPU the heavy one too."""
    out = []
    for model, bound in ((LIGHT, "1.5"), (HEAVY, "1.0")):
        if model == HEAVY and result["providers"][HEAVY] != CUDA:
            continue
        single = _find(result["load"], server="service", model=model, rows=1, clients=1)
        raw_single = _find(result["raw"][model], batch=1)["ms_per_call"]
        out.append(
            {
                "goal": f"{model} on {result['providers'][model]}: p50 at 1 client minus raw single-row inference (ms)",
                "measured": single["p50_ms"] - raw_single,
                "target": f"<= {bound}",
            }
        )
    return out


def _queue_delay_goal(result: dict, top: int) -> list[dict]:
    delay = result["queue_delay"]
    return [
        {
            "goal": f"queue time p99 minus the configured max queue delay ({delay['max_queue_delay_ms']} ms), "
            f"{delay['clients']} clients (ms)",
            "measured": delay["p99_ms"] - delay["max_queue_delay_ms"],
            "target": "<= 1.0",
        }
    ]


def _logging_goals(result: dict, top: int) -> list[dict]:
    out = []
    for row in result["logging"]:
        if row["logging"] != "off":
            out.append(
                {
                    "goal": f"{row['model']}: extra server CPU per request with prediction logging to {row['logging']}",
                    "measured": row["extra_cpu"],
                    "target": "<= 0.10",
                    "note": f"ratio of the means of {row['measurements']} measurements each; per measurement "
                    f"{row['extra_cpu_range'][0]:+.3f} to {row['extra_cpu_range'][1]:+.3f}",
                }
            )
    return out
