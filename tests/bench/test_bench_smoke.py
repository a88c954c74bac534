"""The benchmark scripts run (smoke versions of a few seconds); no time is asserted here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # benchmark smoke runs: server processes, wrk, PostgreSQL, training


@pytest.mark.parametrize("name", ["fit_temperature", "training", "monitoring", "serving", "profile",
                                  "feedback_load"])
def test_benchmark_script_runs_and_writes_its_result(name, tmp_path):
    result = subprocess.run([sys.executable, "-m", f"bench.{name}", "--smoke"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, env=dict(os.environ, BENCH_RESULTS_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / f"{name}-smoke.json").read_text())
    assert data["machine"]["cores"] >= 1 and "|" in result.stdout
