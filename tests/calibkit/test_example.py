"""The README's scikit-learn example runs and calibrates (examples/sklearn_digits_calibration.py)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sklearn_example_lowers_nll_with_temperature_scaling():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sklearn_digits_calibration.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"fitted T = \d+\.\d+", result.stdout)
    before, after = map(float, re.search(r"^NLL\s+([\d.]+) \[.*?\]\s+([\d.]+)", result.stdout, re.MULTILINE).groups())
    assert after < before
