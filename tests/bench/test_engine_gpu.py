"""The pod on a device (bench/gpu/pod.py, run_pod): its load point splits a pod's CPU and batches by process, and its
goals are judged at the best number of front-ends, the two plain replicas only reported beside them."""

import shutil

import pytest

from bench.common import HEAVY, LIGHT, service
from bench.gpu import grpc_connections, point
from bench.gpu import pod_report as report
from bench.serving.goals import POD_VS_RAW, REPLICAS, pod_goals


def test_grpc_connections_reach_every_front_end_and_divide_the_clients():
    for w in (1, 2, 4, 8, 12, 15, 16):
        connections = grpc_connections(w)
        assert connections >= 2 * w and 128 % connections == 0 and 64 % min(64, connections) == 0


def _row(frontends, model, protocol, clients, rps, batch=None, raw=None, p50=None):
    row = {"frontends": frontends, "model": model, "protocol": protocol, "clients": clients, "requests_per_s": rps}
    if batch is not None:
        row |= {"batch": batch, "raw_rows_per_s": raw, "vs_raw": rps / raw}
    return row | ({"p50_ms": p50} if p50 is not None else {})


def test_goals_take_the_best_w_and_report_the_replicas_beside_it():
    points = []
    for protocol in POD_VS_RAW:
        for clients in (64, 128):
            points += [
                _row("4", HEAVY, protocol, clients, 8_000, 16, 10_000),
                _row("12", HEAVY, protocol, clients, 9_000, 20, 12_000),
                _row(REPLICAS, HEAVY, protocol, clients, 9_900, 10, 10_000),  # better, but not the engine
            ]
    points += [_row("4", LIGHT, "binary", 128, 16_000, 20, 100_000), _row(REPLICAS, LIGHT, "binary", 128, 30_000, 8, 9)]
    points += [_row(w, m, "grpc", 1, 300, p50=p) for w, p in (("1", 2.0), ("4", 3.0)) for m in (HEAVY, LIGHT)]
    result = {
        "points": points,
        "single_row": {HEAVY: {"p50_ms": 1.0}, LIGHT: {"p50_ms": 0.2}},
        "parity": [{"server": "W=4", "model": HEAVY, "max_abs_diff": 2e-6}],
        "device_asked": "cpu",
        "seconds_per_point": 1.0,
    }
    found = {g["goal"]: g for g in pod_goals(result)}
    binary = found["heavy, binary, 128 clients: rows/s / onnxruntime alone at the formed batch"]
    assert binary["measured"] == pytest.approx(0.8) and binary["met"] is True and binary["at"].startswith("W = 4")
    assert "2 replicas 0.99" in binary["at"]
    assert found["heavy, json, 64 clients: rows/s / onnxruntime alone at the formed batch"]["met"] == "reported"
    assert found["light, binary: single-row requests/s"]["measured"] == 16_000
    assert found[f"{HEAVY}, W = 1: p50 at 1 client minus raw single-row p50 (ms), worst protocol"]["met"] is True
    assert found[f"{LIGHT}, W > 1: p50 at 1 client minus raw single-row p50 (ms), worst protocol"]["measured"] == 2.8
    assert "### Goals" in report(result | {"goals": list(found.values())})


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is the run's load generator (make tools)")
def test_a_load_point_on_a_pod_splits_cpu_and_batches_between_front_ends_and_engine(tmp_path):
    from bench.common import ROOT

    svc = service(ROOT / "artifacts", f"sqlite:///{tmp_path / 'pod.db'}", True, "cpu", CALIB_FRONTENDS="2")
    try:
        row = point([svc], LIGHT, "binary", 16, 1.0, tmp_path, 2)
    finally:
        svc.stop()
    assert row["errors"] == 0 and row["requests_per_s"] > 0
    assert row["cpu_us_frontends"] > 0 and row["cpu_us_engine"] >= row["cpu_us_engine_loop"] > 0
    # the engine batches the front-ends' messages again: never fewer rows per batch than per message
    assert row["batch"] >= row["message_rows"] >= 1 and row["round_trip_ms"] > 0
