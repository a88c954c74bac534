"""`make help` lists every target of the Makefile with what it does, from the comment above its rule."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_help_describes_every_phony_target():
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    described = dict(line.split(": ", 1) for line in out.splitlines())
    assert sorted(described) == sorted(phony)
    assert all(len(text) > 20 for text in described.values()), described
    assert described["bench-engine"].endswith("(docs/engine_benchmark.md)"), "a description spans its comment lines"
