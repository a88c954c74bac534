"""The benchmarks' own measuring pieces: CPU time per process, the logging cost summary, the binary v2
body and the goals chosen by the device the heavy model ran on. Fast: no server, no load."""

import os
import time

import numpy as np
import pytest

from bench.common import HEAVY, LIGHT, process_cpu_seconds
from bench.serving.goals import _batching_goals, _latency_goal
from bench.serving.harness import CUDA, binary_lua, v2_binary_body
from bench.serving.measure import cpu_summary
from bench.serving.render import gap_decomposition


def test_process_cpu_seconds_counts_this_process_work():
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    spent = process_cpu_seconds(os.getpid()) - before
    assert 0.25 <= spent <= 1.0


def test_cpu_summary_is_the_ratio_of_means_with_the_per_measurement_range():
    summary = cpu_summary([11.0, 12.0, 10.5], [10.0, 10.0, 10.0])
    assert summary["cpu_s_per_10k"] == pytest.approx(11.1666667)
    assert summary["extra_cpu"] == pytest.approx(0.1166667)
    assert summary["extra_cpu_range"] == [0.05, 0.2]
    assert summary["sd"] == pytest.approx(np.std([11.0, 12.0, 10.5], ddof=1))
    assert cpu_summary([10.0, 10.0], [10.0, 10.0])["extra_cpu"] == 0.0


def test_the_binary_body_is_the_json_header_then_the_raw_tensor():
    body, header_length = v2_binary_body(HEAVY, (3, 32, 32), 1)
    assert len(body) - header_length == 3 * 32 * 32 * 4
    header = body[:header_length].decode()
    assert '"binary_data_size":12288' in header and '"name":"probabilities"' in header
    lua = binary_lua("/tmp/body.bin", header_length)
    assert f'"Inference-Header-Content-Length"] = "{header_length}"' in lua and '"rb"' in lua


def _result(provider: str) -> dict:
    heavy_round = {
        "json_rows_per_s": 900.0,
        "json_batch": 20.0,
        "raw_json_rows_per_s": 1000.0,
        "json_vs_raw": 0.9,
        "binary_rows_per_s": 950.0,
        "binary_batch": 22.0,
        "raw_binary_rows_per_s": 1000.0,
        "binary_vs_raw": 0.95,
        "grpc_rows_per_s": 850.0,
        "grpc_batch": 18.0,
        "raw_grpc_rows_per_s": 1000.0,
        "grpc_vs_raw": 0.85,
        "grpc_batching_floor_vs_raw": 0.88,
        "baseline_rows_per_s": 250.0,
        "json_vs_baseline": 3.6,
    }
    load = [
        {"server": server, "model": model, "rows": 1, "clients": clients, "requests_per_s": 1000.0, "p50_ms": 3.0}
        for server in ("service", "baseline")
        for model in (LIGHT, HEAVY)
        for clients in (1, 64)
    ]
    raw = {model: [{"batch": 1, "ms_per_call": 2.5}] for model in (LIGHT, HEAVY)}
    return {
        "providers": {LIGHT: provider, HEAVY: provider},
        "load": load,
        "raw": raw,
        "heavy_rounds": {
            "rounds": [heavy_round],
            "json_vs_raw": heavy_round,
            "binary_vs_raw": heavy_round,
            "grpc_vs_raw": heavy_round,
            "json_vs_baseline": heavy_round,
        },
    }


def test_the_heavy_goals_are_those_of_the_device_it_ran_on():
    cpu = _batching_goals(_result("CPUExecutionProvider"), 64)
    assert [(g["target"], g["measured"]) for g in cpu if "onnxruntime alone" in g["goal"]] == [
        (">= 0.9", 0.9),
        (">= 0.9", 0.95),
        (">= 0.9", 0.85),
    ]
    grpc = next(g for g in cpu if "gRPC" in g["goal"])
    assert "bare grpcio batching floor reached 0.880" in grpc["note"]
    assert not any("baseline" in g["goal"] and "heavy" in g["goal"] for g in cpu)
    gpu = _batching_goals(_result(CUDA), 64)
    assert [g["target"] for g in gpu if "onnxruntime alone" in g["goal"]] == [">= 0.8", ">= 0.8", ">= 0.8"]
    assert any(g["target"] == ">= 3" and g["measured"] == 3.6 for g in gpu)
    assert [g["goal"].split(" on ")[0] for g in _latency_goal(_result("CPUExecutionProvider"), 64)] == [LIGHT]
    gpu_latency = _latency_goal(_result(CUDA), 64)
    assert [(g["goal"].split(" on ")[0], g["target"], g["measured"]) for g in gpu_latency] == [
        (LIGHT, "<= 1.5", 0.5),
        (HEAVY, "<= 1.0", 0.5),
    ]


def test_profile_samples_go_to_the_stage_of_their_innermost_named_frame():
    from bench.profile import OTHER, stage_shares

    raw = "\n".join(
        [
            "python -m service (1);_run_once (/usr/lib/python3.11/asyncio/base_events.py:1922);"
            "predict (/r/service/http/inference.py:40);validate (/r/service/http/codec.py:72);"
            "validate_python (/v/pydantic/main.py:3) 7",
            "python -m service (1);run (/r/service/serving/batching.py:90);run (/r/service/serving/runtime.py:68) 30",
            "python -m service (1);_run_once (/usr/lib/python3.11/asyncio/base_events.py:1922) 5",
            "python -m service (1);mystery (/r/elsewhere.py:1) 2",
            "python -m service (1);infer (/r/service/http/v2.py:80);_parse (/r/service/http/v2.py:120) 3",
            "python -m service (1);infer (/r/service/http/v2.py:80);v2_infer (/r/service/serving/dataplane.py:190) 4",
            "python -m service (1);_serve (/r/service/http/middleware.py:115);"
            "_prepared (/r/service/http/inference.py:60);numeric_rows (/r/service/http/numeric_json.py:50) 6",
            "garbage line",
        ]
    )
    assert stage_shares(raw) == {
        "request validation (pydantic)": 7,
        "onnxruntime inference": 30,
        "event loop and threads": 5,
        OTHER: 2,
        "v2 request: header, tensors, checks": 7,
        "request JSON parse": 6,
    }


def test_the_floor_app_parses_both_request_bodies_as_the_service_does():
    from starlette.testclient import TestClient

    from bench.serving.floor_app import app
    from bench.serving.harness import body

    with TestClient(app) as client:
        assert client.post("/predict", content=body(HEAVY, (3, 32, 32), 1)).status_code == 200
        binary, header_length = v2_binary_body(HEAVY, (3, 32, 32), 1)
        assert (
            client.post(
                f"/v2/models/{HEAVY}/infer",
                content=binary,
                headers={"Inference-Header-Content-Length": str(header_length)},
            ).status_code
            == 200
        )
        with pytest.raises(TypeError):  # a body the service's numeric path leaves to its general one
            client.post("/predict", content=b'{"inputs": [[1, "2"]]}')


def test_the_batching_floor_answers_each_row_its_probabilities_through_the_batcher(monkeypatch):
    from starlette.testclient import TestClient

    from bench.common import ROOT
    from bench.serving import floor_app
    from bench.serving.harness import body

    monkeypatch.setenv("FLOOR_MODEL", str(ROOT / "artifacts" / LIGHT / "1" / "model.onnx"))
    monkeypatch.setattr(floor_app, "floor", None)  # restored to None afterwards, for the floor without a model
    with TestClient(floor_app.app) as client:
        rows = [client.post("/predict", content=body(LIGHT, (1, 8, 8), 1)).json()["probabilities"] for _ in range(3)]
        binary, header_length = v2_binary_body(LIGHT, (1, 8, 8), 2)
        answer = client.post(
            f"/v2/models/{LIGHT}/infer", content=binary, headers={"Inference-Header-Content-Length": str(header_length)}
        ).json()
        counts = client.get("/").json()
    assert np.allclose(np.sum(rows, axis=2), 1.0, atol=1e-5) and np.shape(rows) == (3, 1, 10)
    assert np.shape(answer["probabilities"]) == (2, 10)
    assert counts["rows"] == 5 and 1 <= counts["calls"] <= 4


def test_the_gap_to_onnxruntime_alone_splits_into_stack_hand_offs_and_service_work():
    rounds = [
        {
            "json_vs_raw": 0.80,
            "json_batching_floor_vs_raw": 0.86,
            "json_ceiling": 0.92,
            "binary_vs_raw": 0.82,
            "binary_batching_floor_vs_raw": 0.93,
            "binary_ceiling": 0.97,
        },
        {
            "json_vs_raw": 0.84,
            "json_batching_floor_vs_raw": 0.88,
            "json_ceiling": 0.91,
            "binary_vs_raw": 0.80,
            "binary_batching_floor_vs_raw": 0.95,
            "binary_ceiling": 0.97,
        },
        {
            "json_vs_raw": 0.82,
            "json_batching_floor_vs_raw": 0.85,
            "json_ceiling": 0.93,
            "binary_vs_raw": 0.84,
            "binary_batching_floor_vs_raw": 0.91,
            "binary_ceiling": 0.98,
        },
    ]
    json_row, binary_row = gap_decomposition({"rounds": rounds})
    assert json_row["protocol"] == "json" and json_row["rounds"] == 3
    assert (json_row["service"], json_row["batching_floor"], json_row["ceiling"]) == pytest.approx((0.82, 0.86, 0.92))
    assert json_row["service_range"] == "0.800-0.840"
    assert json_row["http_stack"] == pytest.approx(0.08) and json_row["batching_hand_offs"] == pytest.approx(0.06)
    assert json_row["service_work"] == pytest.approx(0.04)
    # the three parts add up to the service's gap to onnxruntime alone
    for row in (json_row, binary_row):
        assert row["http_stack"] + row["batching_hand_offs"] + row["service_work"] == pytest.approx(1 - row["service"])
    assert binary_row["service_work"] == pytest.approx(0.93 - 0.82)


def test_a_tree_comparison_holds_only_within_the_rounds_spread():
    from bench.serving.trees import summary

    def rows(light: list[float], after_factor: float) -> list[dict]:
        out = []
        for r, value in enumerate(light):
            for tree, factor in (("before", 1.0), ("after", after_factor)):
                ratios = {"light_vs_baseline": value * factor, "json_vs_raw": 0.8, "binary_vs_raw": 0.8}
                out.append({"round": r + 1, "tree": tree} | ratios)
        return out

    steady = {s["ratio"]: s for s in summary(rows([3.0, 3.3, 2.7], 1.05), "before", "after")}
    assert steady["light_vs_baseline"]["within the rounds' spread"]  # 5% inside a 22% spread
    assert steady["light_vs_baseline"]["after / before"].startswith("1.050")
    assert steady["json_vs_raw"]["within the rounds' spread"]  # no change in no spread
    fallen = {s["ratio"]: s for s in summary(rows([3.0, 3.1, 2.95], 0.8), "before", "after")}
    assert not fallen["light_vs_baseline"]["within the rounds' spread"]  # 20% down, rounds 5% apart


def test_every_registered_benchmark_has_its_three_steps_and_a_page():
    from bench.common import ROOT, Benchmark
    from bench.registry import PAGES, module

    for name, page in PAGES.items():
        steps = module(name).BENCHMARK
        assert isinstance(steps, Benchmark) and (ROOT / "bench" / name / "__main__.py").exists(), name
        assert (ROOT / "docs" / page).exists(), page


def test_goal_rows_are_judged_from_their_targets():
    from bench.common import judged

    rows = judged(
        [
            {"goal": "a", "measured": 0.95, "target": ">= 0.9"},
            {"goal": "b", "measured": 2.0, "target": "<= 1.5", "note": "n"},
            {"goal": "c", "measured": -0.04, "target": "within 0.05"},
            {"goal": "d", "measured": 7, "target": "reported"},
        ]
    )
    assert [(r["met"], r["note"]) for r in rows] == [(True, ""), (False, "n"), (True, ""), ("reported", "")]
