"""The GPU-like model of the engine benchmark (bench/engine/fitted.py): a line fitted to the recorded H100 run, and
onnxruntime calls stretched to it, the outputs unchanged."""

import json
import time

import numpy as np
import pytest

from bench.engine.fitted import HEAVY, SESSIONS, fitted_batch_ms, install

ROOT_ARTIFACT = "artifacts/digits-lenet5/1/model.onnx"


def test_the_line_runs_through_the_recorded_heavy_model_times(tmp_path):
    run = {
        "single_row": {HEAVY: {"p50_ms": 2.1}},
        "points": [
            {"model": HEAVY, "batch": 10.0, "raw_rows_per_s": SESSIONS * 10 / 3.0e-3},  # 3 ms a call
            {"model": HEAVY, "batch": 30.0, "raw_rows_per_s": SESSIONS * 30 / 5.0e-3},  # 5 ms a call
            {"model": "other", "batch": 30.0, "raw_rows_per_s": 1.0},
            {"model": HEAVY, "batch": None, "raw_rows_per_s": None},
        ],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    a, c = fitted_batch_ms(path)
    assert (a, c) == pytest.approx((2.0, 0.1))  # the line through (1, 2.1), (10, 3) and (30, 5)


def test_the_recorded_h100_run_gives_a_launch_bound_line():
    a, c = fitted_batch_ms()
    assert 1.0 < a < 3.0 and 0 <= c < 0.05  # about 2 ms a call, nearly flat in the rows


def test_a_stretched_call_lasts_the_fitted_time_and_answers_as_before():
    from bench.common import ROOT
    from service.serving.runtime import ModelRuntime, create_runtime
    from service.settings import Settings

    runtime = create_runtime(ROOT / ROOT_ARTIFACT, Settings(device="cpu"), 1)
    x = np.random.default_rng(0).random((10, 1, 8, 8), dtype=np.float32)
    plain = runtime.run(x)
    original = ModelRuntime.run
    try:
        install("20,1")  # 20 ms + 1 ms a row: 30 ms for 10 rows
        started = time.perf_counter()
        stretched = runtime.run(x)
        elapsed = time.perf_counter() - started
    finally:
        ModelRuntime.run = original  # type: ignore[method-assign]
    assert elapsed >= 0.030
    assert stretched.keys() == plain.keys() and all(np.array_equal(stretched[k], plain[k]) for k in plain)
