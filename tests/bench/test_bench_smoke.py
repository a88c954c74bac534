"""The benchmark scripts run (smoke versions of a few seconds); no time is asserted here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["fit_temperature", "training", "monitoring", "serving", "feedback_load"])
def test_benchmark_script_runs_and_writes_its_result(name):
    result = subprocess.run([sys.executable, "-m", f"bench.{name}", "--smoke"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((ROOT / "bench" / "results" / f"{name}-smoke.json").read_text())
    assert data["machine"]["cores"] >= 1 and "|" in result.stdout
