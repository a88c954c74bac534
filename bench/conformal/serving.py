"""The serving cost of prediction sets: /predict rows/s on the light model with its default sets (``WITH``) against
the same model serving none (``WITHOUT``, its manifest without the ``conformal`` field), in one service process under
``CLIENTS`` closed-loop clients in alternating rounds; beside them, the service's CPU per row and the sets' own CPU
in process (``set_cost``)."""

from __future__ import annotations

import functools
import gc
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.common import (
    LIGHT,
    ROOT,
    ab_rounds,
    histogram_means,
    histogram_totals,
    loopback,
    process_cpu_seconds,
    progress,
    service,
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
    """The light model as version ``WITH`` and, without its manifest's ``entry``, as ``WITHOUT`` (under ``work``)."""
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


def answers(url: str) -> dict[str, dict]:
    """The answer of each version to a single-row /predict."""
    post = functools.partial(loopback.post, f"{url}/predict", headers={"Content-Type": "application/json"}, timeout=30)
    return {v: post(content=request_body(v, 1)).raise_for_status().json() for v in (WITH, WITHOUT)}


def check_sets(url: str) -> dict:
    """One request to each version: ``WITH`` must answer a set per row, ``WITHOUT`` none; the sets and the first one."""
    with_sets, without = answers(url).values()
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
    """``rounds`` alternating rounds per version and row count, each summary with the sets' own CPU (``set_cost``)."""
    cost = functools.partial(set_cost, repeats=cost_repeats)
    checked, rows, summary = compared("conformal", check_sets, cost, "sets_cpu_us_per_row", seconds, rounds, cwd)
    return {"clients": CLIENTS, "sets": checked, "rounds": rows, "summary": summary, "cost_repeats": cost_repeats}


def compared(
    entry: str, check: Callable, cost: Callable | None, key: str, seconds: float, rounds: int, cwd: Path, **env
):
    """(``check(url)``, every round, their ``summarize``) of one service over ``repository(work, entry)``; with
    ``cost``, each summary gets ``cost_ratio`` = without / (without + its CPU per row): what a CPU-bound server
    reaches."""
    work = Path(tempfile.mkdtemp(prefix="calib-bench-sets-"))
    try:
        artifacts = repository(work, entry)
        with service(artifacts, f"sqlite:///{work / 'bench.db'}", cwd=cwd, **env) as svc:
            checked = check(svc.url)
            rows = alternating_rounds(svc, seconds, rounds)
        summary = summarize(rows)
        for s in summary:
            if cost is not None:
                s |= cost(artifacts, s["rows"], s["batch_rows"])
                s["cost_ratio"] = s["without_cpu_us_per_row"] / (s["without_cpu_us_per_row"] + s[key])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return checked, rows, summary


def alternating_rounds(svc, seconds: float, rounds: int) -> list[dict]:
    """Per row count, a warm-up, then ``rounds`` alternating rounds of wrk load per version, printed as they come."""
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
            row = {"rows": rows, "round": r + 1, "seconds": seconds, **sides} | {
                "ratio": m[WITH]["rows_per_s"] / m[WITHOUT]["rows_per_s"],
                "cpu_ratio": m[WITHOUT]["cpu_us_per_row"] / m[WITH]["cpu_us_per_row"],
            }
            rows_out.append(progress(row, ROUND_COLUMNS))
    return rows_out


def cpu_per_row(serve: Callable[[bool], None], repeats: int, rows: int, key: str) -> dict:
    """The median thread CPU per row of ``serve(True)`` over ``serve(False)`` (``key``) and of ``serve(False)``
    (``path_cpu_us_per_row``), alternating, with the garbage collector set as the service sets it."""

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
    with_us, without_us = (float(np.median([r[side] for r in spent])) / 1e3 for side in (True, False))
    return {"cost_batch_rows": rows, key: (with_us - without_us) / rows, "path_cpu_us_per_row": without_us / rows}


@dataclass
class ScoredBatch:
    """A batch of version ``WITH``, run and scored once, that the in-process cost measurements serve from."""

    model: Any
    outputs: dict[str, np.ndarray]
    probabilities: np.ndarray
    scored: Any
    default: Any
    rows: int


def scored_batch(artifacts: Path, rows: int, batch_rows: float) -> ScoredBatch:
    """``batch_rows`` seeded rows (the service's mean batch) through version ``WITH``, scored as the service scores."""
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
    """The CPU the sets' own code adds per row, measured in process where nothing else runs: on one scored batch,
    with sets and without, what the service does with it (the batch's sets; per request its /predict body, encoded,
    and its log rows), alternating, median thread CPU over ``repeats``; the difference per row is the sets' cost."""
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

    return cpu_per_row(serve, repeats, batch.rows, "sets_cpu_us_per_row")
