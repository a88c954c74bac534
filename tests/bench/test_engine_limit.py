"""The engine at the device's limit (bench/gpu/limit.py, run_limit): the timeline's busy share and idle split, and the
issue's goals from one run's points, each pod's ratio taken against the pod of the tree before in the same run."""

import json

import pytest

from bench.common import HEAVY, LIGHT
from bench.gpu import limit_goals as goals
from bench.gpu import limit_report as report
from bench.gpu import timeline


def test_the_timeline_splits_each_session_s_time_into_busy_idle_for_want_of_work_and_waiting(tmp_path):
    line = tmp_path / "timeline.jsonl"
    entries = []
    for thread, offset in (("infer-0", 0.0), ("infer-1", 0.5)):
        # per second of wall time: 0.6 s running, 0.3 s idle with nothing queued, 0.1 s waiting with rows queued
        for k in range(10):
            start = 10 + offset + k
            entries.append(
                {
                    "model": f"{HEAVY}:1",
                    "thread": thread,
                    "rows": 21,
                    "back": start,
                    "queued_back": 0,
                    "taken": start + 0.3,
                    "ran": start + 0.9,
                    "answered": start + 0.9,
                    "sent": start + 0.9,
                }
            )
            entries.append(
                {
                    "model": f"{HEAVY}:1",
                    "thread": thread,
                    "rows": 8,
                    "back": start + 0.9,
                    "queued_back": 5,
                    "taken": start + 1.0,
                    "ran": start + 1.0,
                    "answered": start + 1.0,
                    "sent": start + 1.0,
                }
            )
    entries.append({**entries[0], "model": f"{LIGHT}:1"})  # another model's batches are not counted
    line.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    found = timeline(line, 10.0, 20.5)
    assert found["batches"] == 40
    assert found["sessions_busy"] == pytest.approx(12 / 21)
    assert found["idle_no_work"] == pytest.approx(6 / 21) and found["idle_waiting"] == pytest.approx(2 / 21)
    assert found["engine_ms_by_bucket"]["24"] == [20, pytest.approx(600.0)]  # 21 rows pad to 24 (bucket_step 8)
    assert timeline(tmp_path / "missing", 0, 1) == {}


def test_goals_compare_the_new_pod_with_the_tree_before_in_the_same_run():
    def row(pod, model, clients, rps, **more):
        return {"pod": pod, "model": model, "clients": clients, "requests_per_s": rps} | more

    heavy = {"batch": 21.0, "vs_raw": 0.7, "vs_padded": 0.85, "engine_vs_bucket": 1.05, "sessions_busy": 0.92}
    points = [
        row("new", HEAVY, 128, 13_000, **heavy),
        row("new", LIGHT, 128, 20_000),
        row("new", HEAVY, 1, 600, p50_ms=2.5),
    ]
    points += [row("before", HEAVY, 128, 10_000), row("before", LIGHT, 128, 19_321)]
    points += [
        row("graphs", HEAVY, 128, 14_300),
        row("window 8", HEAVY, 128, 12_350),
        row("new again", HEAVY, 128, 12_740),
    ]
    result = {
        "points": points,
        "single_row": {"p50_ms": 1.53},
        "parity": [
            {"pod": "new", "model": HEAVY, "max_abs_diff": 2.2e-6},
            {"pod": "before", "model": HEAVY, "max_abs_diff": 1.0},
        ],
        "device_asked": "cuda",
        "frontends": 12,
        "seconds_per_point": 4,
    }
    found = {g["goal"]: g for g in goals(result)}
    assert found["rows/s, new / before"]["measured"] == pytest.approx(1.3) and found["rows/s, new / before"]["met"]
    assert found["p50 at one client - onnxruntime alone at one row (ms)"]["measured"] == pytest.approx(0.97)
    assert found["light single rows, new / before"]["measured"] == pytest.approx(20_000 / 19_321)
    assert (
        found["share of time the sessions are busy"]["met"]
        and found["engine time per batch / onnxruntime alone at the bucket"]["met"]
    )
    assert not found["rows/s / onnxruntime alone at the batch formed"]["met"]  # 0.7 against 0.75
    assert found["probabilities against the CPU path (max abs)"]["measured"] == 2.2e-6, "the old tree's pod aside"
    assert found["rows/s, graphs / no graphs"]["measured"] == pytest.approx(1.1)
    assert found["drift: new again / new"]["measured"] == pytest.approx(0.98)
    assert "| rows/s, new / before |" in report(result | {"goals": goals(result)})
