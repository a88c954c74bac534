"""Recorded GPU runs (``gpu.json`` and ``sweep.json`` of real GPU machines, with a ``recorded`` note), committed
because GPU machines are rare: ``recorded_section`` renders the device runs (``bench.serving.device``), the settings
sweeps and the pod's runs (``bench.serving.pod``) into docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import ROOT, table
from bench.serving.device import SWEEP_COLUMNS, report
from bench.serving.pod import report as engine_report

RECORDED = ROOT / "docs" / "benchmarks" / "gpu"


def recorded_section(folder: Path = RECORDED) -> str:
    """docs/benchmarks.md's GPU section: every recorded run (``report``) and settings sweep, by the session that
    recorded it (``recorded.session``, 1 when absent) and then by name."""
    out = [
        "## GPU runs (`python -m bench.gpu`)",
        "",
        "Recorded on lent GPU machines (the run is one command, `python -m bench.gpu --device cuda`, and "
        "`--engine` for the pod; docs/decisions/0001-gpu-run.md, 0020-bucket-sessions.md and 0027-engine-process.md "
        "say what was learnt). Each run's settings are named above its tables.",
    ]
    recorded = [(path, json.loads(path.read_text())) for path in folder.glob("*.json")]
    for path, data in sorted(recorded, key=lambda r: (r[1]["recorded"].get("session", 1), r[0].name)):
        note = f"\n*{path.name}: {data['recorded']['note']}.*\n"
        if data["recorded"].get("kind") == "engine":
            text = engine_report(data).replace("## The engine", f"## GPU run {path.stem}: the engine", 1)
            out += ["\n" + text.replace("\n", "\n" + note, 1).replace("\n### ", "\n#### ")]
        elif "settings" in data:
            out += [
                f"\n## GPU settings sweep ({path.stem})",
                note,
                table(data["settings"], [c for c in SWEEP_COLUMNS if c in data["settings"][0]]),
            ]
            if data.get("batcher_alone"):
                out += [
                    "",
                    "The service's batcher and sessions alone (no HTTP), at the same load:",
                    "",
                    table(data["batcher_alone"], ["sessions", "provider", "rows_per_s", "batch", "onnxruntime_ms"]),
                ]
            out += [
                "",
                "onnxruntime alone at batch 32, beside a pure-Python thread:",
                "",
                table(
                    data["gil"],
                    ["python_thread_busy", "switch_interval_ms", "batch", "sessions", "rows_per_s", "ms_per_call"],
                ),
            ]
        else:
            out += [
                "\n"
                + report(data)
                .replace("## GPU run", f"## GPU run {path.stem},", 1)
                .replace("\n", "\n" + note, 1)
                .replace("\n### ", "\n#### ")
            ]
    return "\n".join(out) + "\n"
