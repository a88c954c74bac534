"""`make demo` (scripts/demo.py): the alarm fires under shift and recalibration brings ECE back down."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # scripts/demo.py spawns a server process


def test_demo_shows_the_alarm_and_the_recovery(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = re.findall(r"^\s*(\d+) (.+?)\s+v(\d) ECE ([0-9.]+) .* alarm: (\w+)$", result.stdout, re.MULTILINE)
    phases = {phase.strip() for _, phase, _, _, _ in rows}
    assert {"in-distribution", "contrast severity 3", "after recalibration"} <= phases
    assert any(state == "alarm" for *_, state in rows)
    shifted_peak = max(float(ece) for _, phase, _, ece, _ in rows if phase.strip() == "collecting shifted labels")
    recovered = [float(ece) for _, phase, version, ece, _ in rows if phase.strip() == "after recalibration"]
    assert all(version == "1" for _, phase, version, _, _ in rows if phase.strip() == "after recalibration")
    assert max(recovered[-6:]) < shifted_peak / 2
    assert "recalibrated: temperature" in result.stdout
    assert (tmp_path / "rolling_ece.png").is_file()
