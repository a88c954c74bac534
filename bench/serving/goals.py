"""The serving benchmark's goals, each a ratio or a difference measured within one run; every goal of the serving
path is stated here once: the full benchmark's (``goals``), the short device run's (``device_goals``) and the pod's
(``pod_goals``)."""

from __future__ import annotations

from bench.common import HEAVY, LIGHT, goal, judged
from bench.serving.harness import CUDA

VS_RAW = {"cpu": 0.9, "gpu": 0.8}
"""Rows/s at 64 single-row clients over onnxruntime alone at the batch size the batcher formed, by device."""
VS_BASELINE_GPU = 3
"""On a GPU: rows/s at 64 single-row clients over the no-batching baseline's."""
LIGHT_VS_BASELINE = 1.5
"""The light model: the service's requests/s at 64 clients over the no-batching baseline's."""
P50_OVER_RAW_MS = {LIGHT: 1.5, HEAVY: 1.0}
"""p50 at one client minus raw single-row inference, ms (the heavy model's judged on a GPU only)."""
PARITY = 1e-5
"""Probabilities on the device against the CPU path: the largest absolute difference."""
POD_VS_RAW = {"binary": 0.8, "grpc": 0.8, "json": 0.6}
"""The pod on a GPU, heavy model at 128 single-row clients: rows/s over onnxruntime alone at the engine's batch."""
POD_LIGHT_BINARY = 15_000
"""The pod on a GPU: the light model's single-row binary requests/s."""
POD_P50_OVER_RAW_MS = 1.5
REPLICAS = "2 replicas"
"""The label of the two plain replicas of the pod's sweep, reported beside it, never its goals' best."""


def _find(records, **match):
    return next(r for r in records if all(r[k] == v for k, v in match.items()))


def goals(result: dict) -> list[dict]:
    """Every goal this run measured (a smoke run: some), the heavy model's those of its device."""
    top, monitoring, memory = result["heavy_rounds"]["clients"], result["monitoring"], result["soak"]
    calibration, feedback = monitoring["calibration"], monitoring["feedback"]
    out = []
    for measured in (_batching_goals, _latency_goal, _queue_delay_goal, _logging_goals):
        try:
            out += measured(result, top)
        except StopIteration:
            continue
    worst = max(calibration, key=lambda r: r["p99_ms"])
    out += [
        goal("feedback labels/s (batches of 1000)", feedback["labels_per_s"], ">= 5000"),
        goal(
            "GET /calibration p99 ms, worst window (quiet or while labels arrive)",
            worst["p99_ms"],
            "<= 50",
            f"window {worst['window']}, labels arriving: {worst['labels_arriving']}",
        ),
        goal(
            f"RSS change after {memory['minutes']:.1f} minutes of load, relative to after the warm-up",
            memory["growth"],
            "within 0.05",
        ),
    ]
    return judged(out)


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
            goal(
                f"heavy on {result['providers'][HEAVY]}: service rows/s at {top} single-row clients "
                f"through {name} / onnxruntime alone at the batch size the batcher formed",
                r[f"{side}_vs_raw"],
                f">= {VS_RAW['gpu' if gpu else 'cpu']}",
                f"{rounds}; this round: {r[f'{side}_rows_per_s']:.0f} vs {r[f'raw_{side}_rows_per_s']:.0f} "
                f"rows/s at {round(r[f'{side}_batch'])} rows (mean batch {r[f'{side}_batch']:.1f}){floor}",
            )
        )
    if gpu:
        r = heavy["json_vs_baseline"]
        out.append(
            goal(
                f"heavy on {CUDA}: service / no-batching baseline at {top} clients",
                r["json_vs_baseline"],
                f">= {VS_BASELINE_GPU}",
                f"{rounds}; this round: {r['json_rows_per_s']:.0f} vs {r['baseline_rows_per_s']:.0f} rows/s",
            )
        )
    light_svc = _find(load, server="service", model=LIGHT, rows=1, clients=top)
    light_base = _find(load, server="baseline", model=LIGHT, rows=1, clients=top)
    out.append(
        goal(
            f"light: service requests/s / baseline at {top} clients",
            light_svc["requests_per_s"] / light_base["requests_per_s"],
            f">= {LIGHT_VS_BASELINE}",
        )
    )
    return out


def _latency_goal(result: dict, top: int) -> list[dict]:
    """p50 at one client over raw single-row inference: the light model (HTTP dominates) everywhere,
    and on a GPU the heavy one too."""
    out = []
    for model, bound in P50_OVER_RAW_MS.items():
        if model == HEAVY and result["providers"][HEAVY] != CUDA:
            continue
        single = _find(result["load"], server="service", model=model, rows=1, clients=1)
        raw_single = _find(result["raw"][model], batch=1)["ms_per_call"]
        out.append(
            goal(
                f"{model} on {result['providers'][model]}: p50 at 1 client minus raw single-row inference (ms)",
                single["p50_ms"] - raw_single,
                f"<= {bound}",
            )
        )
    return out


def _queue_delay_goal(result: dict, top: int) -> list[dict]:
    delay = result["queue_delay"]
    return [
        goal(
            f"queue time p99 minus the configured max queue delay ({delay['max_queue_delay_ms']} ms), "
            f"{delay['clients']} clients (ms)",
            delay["p99_ms"] - delay["max_queue_delay_ms"],
            "<= 1.0",
        )
    ]


def _logging_goals(result: dict, top: int) -> list[dict]:
    return [
        goal(
            f"{row['model']}: extra server CPU per request with prediction logging to {row['logging']}",
            row["extra_cpu"],
            "<= 0.10",
            f"ratio of the means of {row['measurements']} measurements each; per measurement "
            f"{row['extra_cpu_range'][0]:+.3f} to {row['extra_cpu_range'][1]:+.3f}",
        )
        for row in result["logging"]
        if row["logging"] != "off"
    ]


def device_goals(result: dict) -> list[dict]:
    """The short device run's goals (``bench.gpu.run_device``), on the provider the heavy model ran on."""
    provider = result["evidence"]["models"][HEAVY]["provider"]
    points, baseline, single = result["points"], result["baseline_rows_per_s"], result["single_row"]
    heavy = {p["protocol"]: p for p in points if p["model"] == HEAVY}
    out = []
    for protocol, point in heavy.items():
        out += [
            goal(
                f"heavy on {provider}, {protocol}: rows/s at {point['clients']} clients / no-batching baseline",
                point["rows_per_s"] / baseline[HEAVY],
                f">= {VS_BASELINE_GPU}",
            ),
            goal(
                f"heavy on {provider}, {protocol}: rows/s at {point['clients']} clients / onnxruntime alone at "
                f"the formed batch ({point['batch']:.1f} rows)",
                point["vs_raw"],
                f">= {VS_RAW['gpu']}",
            ),
        ]
    out += [
        goal(
            f"{point['model']}, {point['protocol']}: p50 at 1 client minus raw single-row p50 (ms)",
            point["p50_1_client_ms"] - single[point["model"]]["p50_ms"],
            f"<= {P50_OVER_RAW_MS[HEAVY]}",
        )
        for point in points
    ]
    if default := [r["max_abs_diff"] for r in result["parity"] if r["server"] == "service"]:
        name = f"probabilities on {provider} (TF32 off) vs the CPU path: largest absolute difference"
        out.append(goal(name, max(default), f"<= {PARITY}"))
    return judged(out)


def pod_goals(result: dict) -> list[dict]:
    """The pod's goals on a device (``bench.gpu.run_pod``), each at its best W (``at``), the replicas beside it."""

    def at(name: str, measured: float, target: str, where: str) -> dict:
        return {"goal": name, "measured": measured, "target": target, "at": where}

    points = [p for p in result["points"] if p.get("vs_raw") is not None]
    out = []
    for clients in (128, 64):
        for protocol, bound in POD_VS_RAW.items():
            candidates = [p for p in points if (p["model"], p["protocol"], p["clients"]) == (HEAVY, protocol, clients)]
            best = max((p for p in candidates if p["frontends"] != REPLICAS), key=lambda p: p["vs_raw"])
            pair = next((p for p in candidates if p["frontends"] == REPLICAS), None)
            out.append(
                at(
                    f"heavy, {protocol}, {clients} clients: rows/s / onnxruntime alone at the formed batch",
                    best["vs_raw"],
                    f">= {bound}" if clients == 128 else "reported",
                    f"W = {best['frontends']}, batch {best['batch']:.1f}"
                    + (f"; 2 replicas {pair['vs_raw']:.2f} at batch {pair['batch']:.1f}" if pair else ""),
                )
            )
    light = [p for p in points if (p["model"], p["protocol"]) == (LIGHT, "binary") and p["frontends"] != REPLICAS]
    best = max(light, key=lambda p: p["requests_per_s"])
    where = f"W = {best['frontends']}, {best['clients']} clients, batch {best['batch']:.1f}"
    out.append(at("light, binary: single-row requests/s", best["requests_per_s"], f">= {POD_LIGHT_BINARY}", where))
    for model in (HEAVY, LIGHT):
        single = result["single_row"][model]["p50_ms"]
        ones = [p for p in result["points"] if p["model"] == model and p["clients"] == 1]
        pod = [p["frontends"] for p in ones if p["frontends"] not in ("1", REPLICAS)]
        for label, group in (("W = 1", ["1"]), ("W > 1", pod)):
            if chosen := [p for p in ones if p["frontends"] in group]:
                worst = max(chosen, key=lambda p: p["p50_ms"])
                out.append(
                    at(
                        f"{model}, {label}: p50 at 1 client minus raw single-row p50 (ms), worst protocol",
                        worst["p50_ms"] - single,
                        f"<= {POD_P50_OVER_RAW_MS}",
                        f"W = {worst['frontends']}, {worst['protocol']}",
                    )
                )
    name = "probabilities against the CPU path: largest absolute difference, every W"
    out.append(at(name, max(p["max_abs_diff"] for p in result["parity"]), f"<= {PARITY}", "64 rows per model"))
    return judged(out)
