"""The shift simulation (scripts/simulate_shift.py) end to end through the real HTTP API, kept short."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # scripts/simulate_shift.py spawns a server process


def test_simulation_detects_shift_and_stays_quiet_in_distribution(tmp_path):
    out = tmp_path / "sim.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "simulate_shift.py"),
            "--runs",
            "1",
            "--labels",
            "1500",
            "--batch-in",  # labels arrive in batches: fewer evaluation passes to wait for
            "500",
            "--warmup",
            "200",
            "--batch",
            "50",
            "--corruptions",
            "contrast",
            "--severities",
            "4",
            "--max-shifted",
            "600",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["false_alarm_runs"] == [
        {"labels": 1500, "alarm": False, "warnings": data["false_alarm_runs"][0]["warnings"]}
    ]
    rows = {row["scenario"]: row for row in data["scenarios"]}
    assert 0.07 < rows["synthetic, logits x2.5"]["population_ece"] < 0.09
    for name in ("synthetic, logits x2.5", "contrast s4"):
        assert rows[name]["labels_to_alarm"] is not None and rows[name]["labels_to_alarm"] <= 500, rows[name]
        assert rows[name]["final_state"] == "alarm"
    assert "| contrast s4 |" in out.with_suffix(".md").read_text()
