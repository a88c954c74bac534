"""The serving cost of prediction sets: /predict rows/s on the light model with its default sets against the same
model serving none.

One service process serves the committed light model twice, as two versions of one model repository: version
``WITH`` as committed (its conformal scores, so every /predict answers the default sets, computed once per batch on
the inference thread, listed per row and logged), and version ``WITHOUT``, the same files but for the manifest's
``conformal`` field, removed, so that it serves no sets. Both take the same requests (bodies that differ only in the
version they name), under closed-loop load of ``CLIENTS`` clients (wrk), prediction logging on (SQLite), as the
serving benchmark runs the service. Rounds alternate the order (with, without, then without, with, ...), so that the
machine's drift hits both alike; per row count, reported are each round's ratio of rows/s with sets over without,
their median and range, and the round-to-round spread: the larger max / min of either version's rows/s over the
rounds, as ``bench.serving.trees`` judges a serving change. On a machine shared with other load, the service process's
own CPU time per row (``/proc``) moves less than its rows/s: ``cpu_ratio``, CPU per row without sets over with, is the
throughput ratio a CPU-bound server would reach.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.common import (
    LIGHT,
    ROOT,
    ab_rounds,
    histogram_means,
    histogram_totals,
    process_cpu_seconds,
    service,
    table,
    wrk,
)
from bench.serving.measure import SHAPES
from service.cli import GC_THRESHOLD

CLIENTS = 64
#: Rows per request: single-row clients (the goal's load), and 8-row requests.
ROW_COUNTS = (1, 8)
WITH, WITHOUT = "1", "2"
ROUND_COLUMNS = (
    "rows round with_rows_per_s without_rows_per_s ratio with_cpu_us_per_row without_cpu_us_per_row cpu_ratio "
    "with_batch_rows without_batch_rows"
).split()
SUMMARY_COLUMNS = (
    "rows rounds seconds median_ratio ratio_range spread median_cpu_ratio batch_rows sets_cpu_us_per_row "
    "without_cpu_us_per_row path_cpu_us_per_row cost_ratio"
).split()
#: Calls of each side of the in-process measurement of the sets' own CPU (``set_cost``).
COST_REPEATS = 3000


def repository(work: Path, entry: str = "conformal") -> Path:
    """A model repository under ``work``: the committed light model as version ``WITH`` and, without its manifest's
    ``entry`` (``conformal``, with its conformal file; or ``label_shift``), as version ``WITHOUT``."""
    artifacts = work / "artifacts"
    source = ROOT / "artifacts" / LIGHT / "1"
    shutil.copytree(source, artifacts / LIGHT / WITH)
    plain = artifacts / LIGHT / WITHOUT
    shutil.copytree(source, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    if manifest.get(entry) is None:
        raise RuntimeError(f"{source} has no {entry} entry: there is nothing to measure")
    removed = manifest.pop(entry)
    if entry == "conformal":
        (plain / removed["file"]).unlink()
    manifest["version"] = WITHOUT
    (plain / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return artifacts


def request_body(version: str, rows: int) -> str:
    """A /predict body of ``rows`` seeded rows of the light model's shape, naming ``version``."""
    x = np.random.default_rng(1).random((rows, *SHAPES[LIGHT])).round(3).tolist()
    return json.dumps({"model": LIGHT, "version": version, "inputs": x})


def check_sets(url: str, bodies: dict[str, str]) -> dict:
    """One request to each version: ``WITH`` answers a set per row, ``WITHOUT`` none (else the comparison is
    void). Returns the sets' description and the first row's set."""
    answers = {
        v: httpx.post(f"{url}/predict", content=b, headers={"Content-Type": "application/json"}, timeout=30)
        for v, b in bodies.items()
    }
    for answer in answers.values():
        answer.raise_for_status()
    with_sets, without = answers[WITH].json(), answers[WITHOUT].json()
    if with_sets["conformal"] is None or with_sets["predictions"][0]["prediction_set"] is None:
        raise RuntimeError(f"version {WITH} served no sets")
    if without["conformal"] is not None or without["predictions"][0]["prediction_set"] is not None:
        raise RuntimeError(f"version {WITHOUT} served sets")
    return {"conformal": with_sets["conformal"], "first_set": with_sets["predictions"][0]["prediction_set"]}


def summarize(rounds: list[dict]) -> list[dict]:
    """Per row count: the median and range of the per-round ratios, and the round-to-round spread (the larger
    max / min of either version's rows/s over the rounds)."""
    out = []
    for rows in sorted({r["rows"] for r in rounds}):
        mine = [r for r in rounds if r["rows"] == rows]
        ratios = sorted(r["ratio"] for r in mine)
        spread = max(
            max(r[key] for r in mine) / min(r[key] for r in mine) for key in ("with_rows_per_s", "without_rows_per_s")
        )
        out.append(
            {
                "rows": rows,
                "rounds": len(mine),
                "seconds": mine[0]["seconds"],
                "median_ratio": float(np.median(ratios)),
                "ratio_range": f"{ratios[0]:.3f}-{ratios[-1]:.3f}",
                "low": ratios[0],
                "high": ratios[-1],
                "spread": spread,
                "median_cpu_ratio": float(np.median([r["cpu_ratio"] for r in mine])),
                # the smaller of the two: sets slow a batch down, so more rows queue for the next one, and a
                # smaller batch spreads the sets' cost per call over fewer rows
                "batch_rows": min(
                    float(np.median([r[f"{side}_batch_rows"] for r in mine])) for side in ("with", "without")
                ),
                "without_cpu_us_per_row": float(np.median([r["without_cpu_us_per_row"] for r in mine])),
            }
        )
    return out


def run(seconds: float, rounds: int, cwd: Path = ROOT, cost_repeats: int = COST_REPEATS) -> dict:
    """``rounds`` alternating rounds of ``seconds`` per version and row count in ``ROW_COUNTS``, after a
    one-second warm-up of each, on a service run from the source tree ``cwd``; the rows of every round and their
    ``summarize``."""
    work = Path(tempfile.mkdtemp(prefix="calib-bench-sets-"))
    try:
        artifacts = repository(work)
        with service(artifacts, f"sqlite:///{work / 'bench.db'}", True, "cpu", cwd=cwd) as svc:
            checked = check_sets(svc.url, {v: request_body(v, 1) for v in (WITH, WITHOUT)})
            rows_out = alternating_rounds(svc, seconds, rounds)
        summary = summarize(rows_out)
        for s in summary:
            s |= set_cost(artifacts, s["rows"], s["batch_rows"], cost_repeats)
            s["cost_ratio"] = s["without_cpu_us_per_row"] / (s["without_cpu_us_per_row"] + s["sets_cpu_us_per_row"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"clients": CLIENTS, "sets": checked, "rounds": rows_out, "summary": summary, "cost_repeats": cost_repeats}


def alternating_rounds(svc, seconds: float, rounds: int) -> list[dict]:
    """Per row count of ``ROW_COUNTS``: a one-second warm-up of each version, then ``rounds`` alternating rounds
    (``ab_rounds``) of ``seconds`` of wrk load on each; each round's rows/s, service CPU per row and mean batch per
    version and their ratios (``ROUND_COLUMNS``), printed as they come."""
    rows_out, url, key = [], f"{svc.url}/predict", f"batch:{LIGHT}"
    for rows in ROW_COUNTS:
        bodies = {v: request_body(v, rows) for v in (WITH, WITHOUT)}

        def load(version: str, _round: int, rows: int = rows, bodies: dict = bodies) -> dict:
            start, histograms = process_cpu_seconds(svc.process.pid), histogram_totals(svc.url)
            result = wrk(url, bodies[version], CLIENTS, seconds)
            if result["non_2xx"] or result["socket_errors"]:
                raise RuntimeError(f"version {version}, {rows} rows: {result}")
            used = process_cpu_seconds(svc.process.pid) - start
            return {
                "rows_per_s": result["requests_per_s"] * rows,
                "cpu_us_per_row": 1e6 * used / (result["requests"] * rows),
                "batch_rows": histogram_means(histograms, histogram_totals(svc.url), [key])[key],
            }

        def warm_up(version: str, bodies: dict = bodies) -> None:
            wrk(url, bodies[version], CLIENTS, 1.0)

        for r, m in enumerate(ab_rounds((WITH, WITHOUT), rounds, load, warm_up)):
            sides = {
                f"{side}_{k}": v for side, ver in (("with", WITH), ("without", WITHOUT)) for k, v in m[ver].items()
            }
            rows_out.append(
                {"rows": rows, "round": r + 1, "seconds": seconds, **sides}
                | {
                    "ratio": m[WITH]["rows_per_s"] / m[WITHOUT]["rows_per_s"],
                    "cpu_ratio": m[WITHOUT]["cpu_us_per_row"] / m[WITH]["cpu_us_per_row"],
                }
            )
            print(table([rows_out[-1]], ROUND_COLUMNS).splitlines()[-1], flush=True)
    return rows_out


def paired_cpu_us(serve: Callable[[bool], None], repeats: int) -> tuple[float, float]:
    """The median thread CPU time, in microseconds, of ``serve(True)`` and of ``serve(False)``, called alternately
    ``repeats`` times each, with the garbage collector set as the service sets it (``service.cli``)."""

    def timed(side: bool, _round: int) -> int:
        start = time.thread_time_ns()
        serve(side)
        return time.thread_time_ns() - start

    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *thresholds[1:])
    try:
        spent = ab_rounds((True, False), repeats, timed)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    return tuple(float(np.median([r[side] for r in spent])) / 1e3 for side in (True, False))  # type: ignore[return-value]


@dataclass
class ScoredBatch:
    """A batch of the light model's version ``WITH``, run and scored once, with its default set choice: what the
    in-process cost measurements (``set_cost``, ``bench.shift.serving.adaptation_cost``) serve from."""

    model: Any
    outputs: dict[str, np.ndarray]
    probabilities: np.ndarray
    scored: Any
    default: Any
    rows: int


def scored_batch(artifacts: Path, rows: int, batch_rows: float) -> ScoredBatch:
    """``batch_rows`` rows (the mean the service formed, rounded to whole requests of ``rows`` rows) of seeded inputs
    through version ``WITH`` of ``artifacts``' light model, scored as the service scores a batch."""
    from service.serving.repository import ModelRepository
    from service.serving.scoring import score
    from service.settings import Settings

    repo = ModelRepository(Settings(artifacts=artifacts, default_model=LIGHT))
    repo.load()
    model = repo.get(LIGHT, WITH)
    requests = max(1, round(batch_rows / rows))
    x = np.random.default_rng(2).random((requests * rows, *SHAPES[LIGHT])).astype(np.float32)
    outputs = model.runtime.run(x)
    names = model.manifest.outputs
    scored = score(outputs[names["logits"]], outputs[names["probabilities"]], 0, None, encode=True)
    default = model.sets.choice(None, None, False)
    assert default is not None  # version WITH serves sets
    return ScoredBatch(model, outputs, outputs[names["probabilities"]], scored, default, requests * rows)


def set_cost(artifacts: Path, rows: int, batch_rows: float, repeats: int) -> dict:
    """The CPU that the sets' own code adds per row, measured in process, where nothing else runs: a batch of the
    light model of ``batch_rows`` rows (the mean the service formed, rounded to whole requests of ``rows`` rows),
    scored once; then, with sets and without, what the service does with it: with sets, the batch's default sets
    (``ModelSets.sets``, ``listed``); for each request, its share of the batch, its /predict body
    (``DataPlane.respond``) encoded as the codec encodes it, and its prediction-log rows. Both sides alternate,
    thread CPU time per call, median over ``repeats``, with the garbage collector set as the service sets it; the
    difference per row is the sets' cost, the batch's and its requests' alike."""
    from service.schemas import PredictOptions
    from service.serving.dataplane import DataPlane
    from service.serving.scoring import InferenceResult

    batch = scored_batch(artifacts, rows, batch_rows)
    model, scored = batch.model, batch.scored
    options = PredictOptions()

    def serve(with_sets: bool) -> None:
        sets = model.sets.sets(batch.probabilities, scored.ids, batch.default).listed() if with_sets else None
        result = InferenceResult(batch.outputs, scored, sets)
        for start in range(0, len(scored), rows):
            share = result[start : start + rows]
            body = DataPlane.respond(None, model, options, share.scored, share.scored.ids, share.sets)  # type: ignore[arg-type]
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            share.scored.prediction_rows(model.name, model.version, sets=share.sets)

    with_us, without_us = paired_cpu_us(serve, repeats)
    return {
        "cost_batch_rows": batch.rows,
        "sets_cpu_us_per_row": (with_us - without_us) / batch.rows,
        "path_cpu_us_per_row": without_us / batch.rows,
    }
