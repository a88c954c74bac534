"""The benchmark scripts run (smoke versions of a few seconds); no time is asserted here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.registry import PAGES

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # benchmark smoke runs: server processes, wrk, PostgreSQL, training


@pytest.mark.parametrize("name", [name for name in PAGES if name != "alarm"])
def test_benchmark_runs_from_the_registry_and_writes_its_result(name, tmp_path, request):
    if name in ("feedback_load", "store"):  # PostgreSQL databases, on the suite's server (CALIB_BENCH_DATABASE_URL)
        request.getfixturevalue("postgres_server")
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--only", name, "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, BENCH_RESULTS_DIR=str(tmp_path)),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / f"{name}-smoke.json").read_text())
    assert data["machine"]["cores"] >= 1 and data["wall_seconds"] > 0 and isinstance(data["goals"], list)
    assert "|" in result.stdout and f"| {name} | " in result.stdout  # the rendering, and the runner's times
    if name == "serving":  # the monitoring and memory measurements of its soak server are part of its result
        assert data["monitoring"]["calibration"] and data["soak"]["samples"]
    if name == "engine":  # the GPU-like model's calls take its fitted time in process and in both pods' engines
        from bench.engine.fitted import fitted_batch_ms

        fitted = {r["frontends"]: r for r in data["service"] if r["model"] == "fitted"}
        assert fitted.keys() == {"1", "pod of 1", "2"}
        assert all(r["inference_ms"] >= fitted_batch_ms()[0] and r["requests"] > 0 for r in fitted.values())
    if name == "profile":  # the cores by thread, measured without the profiler, account for the whole machine
        for run in data["runs"]:
            for split in (run["unprofiled"], run["batching_floor"]):
                cores = {row["where"]: row["cores"] for row in split["threads"]}
                inference = [c for w, c in cores.items() if w.startswith("infer-")]
                assert cores["event loop (MainThread)"] > 0 and inference and all(c > 0 for c in inference)
                assert sum(cores.values()) == pytest.approx(data["machine"]["cores"], abs=0.15)
            compared = {row["where"]: row for row in run["compared"]}
            loop = compared["event loop (MainThread)"]
            assert loop["added_ms_per_request"] == pytest.approx(
                loop["service_ms_per_request"] - loop["floor_ms_per_request"]
            )
            assert compared["inference threads"]["floor_cores"] == pytest.approx(
                sum(row["cores"] for row in run["batching_floor"]["threads"] if row["where"].startswith("infer-"))
            )


def test_alarm_benchmark_prints_the_oracle_ratios_and_the_goals(tmp_path):
    # the simulations only (the HTTP parts are the feedback_load smoke run above and scripts/simulate_shift.py's tests)
    result = subprocess.run(
        [sys.executable, "-m", "bench.alarm", "--smoke", "--skip-http"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, BENCH_RESULTS_DIR=str(tmp_path)),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "alarm-smoke.json").read_text())
    rows = data["shifts"]
    assert len(rows) == 32 and {"oracle_p50", "ratio", "clear_oracle_p50", "clear_ratio"} <= set(rows[0])
    large = next(r for r in rows if r["shape"] == "cifar-like" and r["shift"] == "logits x2.5")
    assert large["oracle_p50"] > 0 and large["ratio"] == pytest.approx(large["delay_p50"] / large["oracle_p50"])
    assert large["clear_family_blind_ratio"] == pytest.approx(
        large["clear_family_blind_p50"] / max(large["clear_oracle_p50"], 1.0)
    )
    assert len(data["false_alarms"]) == 20 and {r["rule"] for r in data["warnings"]} == {
        "p < 0.001",
        "p < 0.001 and D >= 0.1",
    }
    assert "ratio" in result.stdout and any(g["goal"].startswith("detection") for g in data["goals"])
    assert any(g["goal"].startswith("information limit (clearing)") for g in data["goals"])
