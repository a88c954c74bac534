"""The GPU run (bench.gpu) keeps working: its smoke version on the CPU, in the fast tier, and its hand-built binary v2
body is the one tritonclient.http sends."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common import HEAVY, LIGHT, Server, parent_pid, v2_binary_request
from bench.gpu import v2_binary_outputs

ROOT = Path(__file__).resolve().parents[2]


def test_the_binary_body_is_the_one_tritonclient_sends():
    triton = pytest.importorskip("tritonclient.http")
    x = np.random.default_rng(0).random((2, 3, 4, 4), dtype=np.float32)
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    expected, expected_length = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=[triton.InferRequestedOutput("probabilities", binary_data=True)]
    )
    got, length = v2_binary_request(x)
    assert json.loads(got[:length]) == json.loads(expected[:expected_length])
    assert got[length:] == expected[expected_length:] == x.tobytes()


def test_binary_and_json_outputs_are_read_back_in_the_header_order():
    probabilities = np.array([[0.25, 0.75]], dtype=np.float32)
    header = json.dumps(
        {
            "outputs": [
                {"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
                {"name": "label", "datatype": "INT64", "shape": [1], "data": [1]},
            ]
        }
    ).encode()
    response = httpx.Response(
        200, content=header + probabilities.tobytes(), headers={"Inference-Header-Content-Length": str(len(header))}
    )
    out = v2_binary_outputs(response)
    np.testing.assert_array_equal(out["probabilities"], probabilities)
    np.testing.assert_array_equal(out["label"], [1])


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is the GPU run's load generator (make tools)")
def test_the_gpu_run_smoke_version_runs_on_the_cpu_and_reports_every_measurement(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--out", str(tmp_path), "--device", "cpu", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, BENCH_RESULTS_DIR=str(tmp_path)),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "gpu.json").read_text())
    points = {(p["model"], p["protocol"]): p for p in data["points"]}
    assert set(points) == {(m, p) for m in (HEAVY, LIGHT) for p in ("json", "binary")}
    for point in points.values():
        assert point["rows_per_s"] > 0 and point["raw_rows_per_s"] > 0 and point["non_2xx"] == 0
        assert point["vs_raw"] == pytest.approx(point["rows_per_s"] / point["raw_rows_per_s"])
        assert point["batch"] >= 1 and point["p99_1_client_ms"] >= point["p50_1_client_ms"] > 0
        assert point["inference_ms"] > 0 and point["queue_ms"] is not None
    assert points[(HEAVY, "json")]["parse_ms"] > 0  # the JSON stages come from /predict's own histograms
    assert {m: v["provider"] for m, v in data["evidence"]["models"].items()} == {
        HEAVY: "CPUExecutionProvider",
        LIGHT: "CPUExecutionProvider",
    }
    assert any('provider="CPUExecutionProvider"' in line for line in data["evidence"]["metrics"])
    # the same inputs through two CPU services: bit-identical probabilities
    assert [(r["model"], r["max_abs_diff"], r["argmax_agree"]) for r in data["parity"]] == [
        (HEAVY, 0.0, 1.0),
        (LIGHT, 0.0, 1.0),
    ]
    assert data["variants"] == []  # the CUDA settings are compared only where CUDA runs
    assert all(v > 0 for v in data["baseline_rows_per_s"].values()) and data["profile"]["model_run_ms"] > 0
    hidden = data["cuda_unavailable"]
    assert hidden["started"] and hidden["predict_status"] == 200
    assert hidden["predict_provider"] == "CPUExecutionProvider"
    assert all(
        m["requested_providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        for m in hidden["health"]["models"].values()
    )
    assert len(data["goals"]) == 9 and all(isinstance(g["met"], bool) for g in data["goals"])
    markdown = (tmp_path / "gpu.md").read_text()
    assert "### Goals" in markdown and markdown in result.stdout


LAUNCHER = """
import signal, subprocess, sys
from pathlib import Path
signal.signal(signal.SIGINT, lambda *_: (Path(sys.argv[1]).touch(), sys.exit(0)))
subprocess.Popen(sys.argv[2:]).wait()
"""
"""Starts the command after its first argument, then on SIGINT writes that file and exits 0, as py-spy does."""


def test_a_launcher_is_interrupted_and_the_server_it_started_is_stopped(tmp_path):
    done = tmp_path / "written"
    serve = "import sys, http.server as h; h.HTTPServer(('127.0.0.1', int(sys.argv[2])), h.BaseHTTPRequestHandler)"
    # a launcher in Python: it takes SIGINT even when started with SIGINT ignored, as a pytest-xdist worker's children
    # may be, where a shell's trap cannot
    launcher = [sys.executable, "-c", LAUNCHER, str(done)]
    server = Server([*launcher, sys.executable, "-c", serve + ".serve_forever()"], None, probe=_port_open)
    children = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if parent_pid(p) == server.process.pid]
    assert len(children) == 1
    server.interrupt()
    assert done.exists() and server.process.returncode == 0  # the launcher wrote its results on SIGINT
    for _ in range(100):
        if not Path(f"/proc/{children[0]}").exists() or "Z" in _state(children[0]):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the server the launcher started outlived it")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
