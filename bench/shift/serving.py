"""The serving cost of label shift's features: /predict rows/s on the light model with them (version ``WITH``, its
manifest's ``label_shift`` entry) against the same model without (``WITHOUT``), measured as the sets' cost is
(``bench.conformal.serving``). The evaluator runs in the same process, so its folding and EM count in both the
throughput and the CPU per row; beside them, the request path's own added CPU, in process (``adaptation_cost``)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import orjson

from bench.common import LIGHT, ROOT, loopback
from bench.conformal.serving import (
    COST_REPEATS,
    WITH,
    WITHOUT,
    answers,
    compared,
    cpu_per_row,
    request_body,
    scored_batch,
)

#: The settings measured: the default (the alarm and the estimates run, nothing is adapted) and adaptation always.
MODES = ("off", "always")


def wait_for_priors(url: str, timeout: float = 60.0) -> str:
    """Send ``WITH`` some traffic until the evaluator has estimated its priors; their version."""
    deadline = time.monotonic() + timeout
    body = request_body(WITH, 8)
    while time.monotonic() < deadline:
        loopback.post(f"{url}/predict", content=body, headers={"Content-Type": "application/json"}, timeout=30)
        report = loopback.get(f"{url}/calibration", params={"model": LIGHT, "version": WITH}, timeout=30).json()
        served = report["label_shift"].get("served_priors")
        if served is not None:
            return served["version"]
        time.sleep(0.5)
    raise RuntimeError(f"no priors estimated for version {WITH} within {timeout} s")


def check_adapted(url: str, adapt: str) -> dict:
    """Once the priors are estimated: with "always", ``WITH`` must answer adapted probabilities and weighted sets."""
    wait_for_priors(url)
    if adapt != "always":
        return {"adapt": adapt}
    got = answers(url)
    if got[WITH]["priors_version"] is None or "priors=" not in got[WITH]["conformal"]["threshold_version"]:
        raise RuntimeError(f"version {WITH} was not served adapted: {got[WITH]['conformal']}")
    if got[WITHOUT]["priors_version"] is not None:
        raise RuntimeError(f"version {WITHOUT} was served adapted")
    return {"priors_version": got[WITH]["priors_version"], "conformal": got[WITH]["conformal"]}


def run(seconds: float, rounds: int, cwd: Path = ROOT, cost_repeats: int = COST_REPEATS, adapt: str = "always") -> dict:
    """Alternating rounds per version and row count under ``CALIB_SHIFT__ADAPT=adapt`` ("off": the evaluator's work)."""
    cost = functools.partial(adaptation_cost, repeats=cost_repeats) if adapt == "always" else None
    checked, rows, summary = compared(
        "label_shift",
        functools.partial(check_adapted, adapt=adapt),
        cost,
        "adaptation_cpu_us_per_row",
        seconds,
        rounds,
        cwd,
        # fold predictions at once, evaluate every second, adapt as told
        CALIB_SHIFT__ADAPT=adapt,
        CALIB_SHIFT__SETTLE_SECONDS="0",
        CALIB_MONITORING__EVALUATE_SECONDS="1",
    )
    return {"adapt": adapt, "adapted": checked, "rounds": rows, "summary": summary, "cost_repeats": cost_repeats}


def adaptation_cost(artifacts: Path, rows: int, batch_rows: float, repeats: int) -> dict:
    """The request path's CPU per row added by adaptation, in process, measured as ``set_cost`` measures the sets'."""
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

    return cpu_per_row(serve, repeats, batch.rows, "adaptation_cpu_us_per_row")
