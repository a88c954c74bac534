"""The serving cost of label shift's features: /predict rows/s on the light model with them against the same model
without, measured as the sets' cost is (``bench.conformal.serving``).

One service process serves the committed light model twice: version ``WITH`` as committed (its manifest's
``label_shift`` entry, so the evaluator folds every prediction into the label-shift alarm and estimates the priors
of the drift window, and, under ``CALIB_SHIFT__ADAPT=always``, every /predict answers adapted probabilities and
weighted sets), and version ``WITHOUT``, the same files without that entry (no alarm, no priors, no adaptation). Both
serve the default sets and log their predictions. Rounds alternate under wrk's closed-loop load; the evaluator runs
every second in the same process, so its folding and EM count in both the throughput and the process's CPU per row.
Beside them, the request path's own added CPU, in process (``adaptation_cost``).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.common import LIGHT, ROOT, service
from bench.conformal.serving import (
    COST_REPEATS,
    WITH,
    WITHOUT,
    alternating_rounds,
    paired_cpu_us,
    repository,
    request_body,
    scored_batch,
    summarize,
)

#: The settings measured: the default (the alarm and the estimates run, nothing is adapted) and adaptation always.
MODES = ("off", "always")


def wait_for_priors(url: str, timeout: float = 60.0) -> str:
    """Send ``WITH`` some traffic until the evaluator has estimated its priors; their version."""
    deadline = time.monotonic() + timeout
    body = request_body(WITH, 8)
    while time.monotonic() < deadline:
        httpx.post(f"{url}/predict", content=body, headers={"Content-Type": "application/json"}, timeout=30)
        report = httpx.get(f"{url}/calibration", params={"model": LIGHT, "version": WITH}, timeout=30).json()
        served = report["label_shift"].get("served_priors")
        if served is not None:
            return served["version"]
        time.sleep(0.5)
    raise RuntimeError(f"no priors estimated for version {WITH} within {timeout} s")


def check_adapted(url: str) -> dict:
    """One request to each version: ``WITH`` answers adapted probabilities and weighted sets, ``WITHOUT`` neither."""
    answers = {
        v: httpx.post(
            f"{url}/predict", content=request_body(v, 1), headers={"Content-Type": "application/json"}, timeout=30
        ).json()
        for v in (WITH, WITHOUT)
    }
    if answers[WITH]["priors_version"] is None or "priors=" not in answers[WITH]["conformal"]["threshold_version"]:
        raise RuntimeError(f"version {WITH} was not served adapted: {answers[WITH]['conformal']}")
    if answers[WITHOUT]["priors_version"] is not None:
        raise RuntimeError(f"version {WITHOUT} was served adapted")
    return {"priors_version": answers[WITH]["priors_version"], "conformal": answers[WITH]["conformal"]}


def run(seconds: float, rounds: int, cwd: Path = ROOT, cost_repeats: int = COST_REPEATS, adapt: str = "always") -> dict:
    """``rounds`` alternating rounds of ``seconds`` per version and row count, on a service run from ``cwd`` with
    ``CALIB_SHIFT__ADAPT=adapt``; the rows of every round, their ``summarize`` and, when adapting, the request path's
    added CPU per row. With ``adapt`` "off" (the default setting), what remains is the evaluator's work: the alarm's
    folding and the estimates."""
    work = Path(tempfile.mkdtemp(prefix="calib-bench-shift-"))
    try:
        artifacts = repository(work, "label_shift")
        # fold predictions at once, evaluate every second, adapt as told
        with service(
            artifacts,
            f"sqlite:///{work / 'bench.db'}",
            cwd=cwd,
            CALIB_SHIFT__ADAPT=adapt,
            CALIB_SHIFT__SETTLE_SECONDS="0",
            CALIB_MONITORING__EVALUATE_SECONDS="1",
        ) as svc:
            wait_for_priors(svc.url)
            checked = check_adapted(svc.url) if adapt == "always" else {"adapt": adapt}
            rows_out = alternating_rounds(svc, seconds, rounds)
        summary = summarize(rows_out)
        for s in summary if adapt == "always" else []:
            s |= adaptation_cost(artifacts, s["rows"], s["batch_rows"], cost_repeats)
            s["cost_ratio"] = s["without_cpu_us_per_row"] / (
                s["without_cpu_us_per_row"] + s["adaptation_cpu_us_per_row"]
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"adapt": adapt, "adapted": checked, "rounds": rows_out, "summary": summary, "cost_repeats": cost_repeats}


def adaptation_cost(artifacts: Path, rows: int, batch_rows: float, repeats: int) -> dict:
    """The CPU the adaptation adds per row on the request path, in process: a batch of ``batch_rows`` rows of the
    light model scored once with its default sets; then for each request's share, its /predict body and log rows,
    with adaptation (the adapted probabilities, the weighted sets) and without (the batch's sets). Both sides
    alternate, thread CPU time, median over ``repeats``, the garbage collector as the service sets it."""
    from service.schemas import PredictOptions
    from service.serving.adaptation import Adaptation, adapted
    from service.serving.dataplane import DataPlane
    from service.serving.scoring import InferenceResult

    batch = scored_batch(artifacts, rows, batch_rows)
    model, scored, default = batch.model, batch.scored, batch.default
    reference = model.manifest.label_shift
    assert reference is not None  # version WITH keeps its entry
    k = len(model.manifest.class_names)
    priors = np.random.default_rng(3).dirichlet(np.ones(k))
    adaptation = Adaptation("em:500:bench", priors / np.asarray(reference.priors), tuple(priors), True)
    names = model.manifest.outputs
    result = InferenceResult(batch.outputs, scored, model.sets.sets(batch.probabilities, scored.ids, default).listed())
    options = PredictOptions()

    respond = functools.partial(DataPlane.respond, None, model, options)  # type: ignore[arg-type]

    def serve(adapt: bool) -> None:
        for start in range(0, len(scored), rows):
            share = result[start : start + rows]
            if adapt:
                probs = share.outputs[names["probabilities"]]
                served = model.sets.label_shift_sets(probs, share.scored.ids, default, adaptation.weights, "v")
                body = respond(adapted(share.scored, adaptation), share.scored.ids, served)
                logged = share.scored.prediction_rows(model.name, model.version, sets=served, priors_version="v")
            else:
                body = respond(share.scored, share.scored.ids, share.sets)
                logged = share.scored.prediction_rows(model.name, model.version, sets=share.sets)
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            del logged

    with_us, without_us = paired_cpu_us(serve, repeats)
    return {
        "cost_batch_rows": batch.rows,
        "adaptation_cpu_us_per_row": (with_us - without_us) / batch.rows,
        "path_cpu_us_per_row": without_us / batch.rows,
    }
