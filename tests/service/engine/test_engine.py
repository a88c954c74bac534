"""The engine process and a front-end's client (service.engine): outputs equal to the in-process sessions', replies
routed to their requests, the engine's refusals relayed as the service's errors, and a dead engine failing every
waiting request at once, then served again once it is back."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from service.engine import wire
from service.engine.client import EngineClient
from service.engine.server import EngineServer
from service.errors import EngineUnavailable, ModelNotFound, Overloaded
from service.serving.batching import DynamicBatcher
from service.serving.runtime import create_runtime
from service.settings import BatchingConfig, Settings
from training.data import load_dataset

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"


def test_frames_carry_the_header_and_the_raw_bytes_without_pickle():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frames = wire.request(7, "m", "1", x)
    header, rows = wire.read_request([bytes(f) for f in frames])
    assert (header.seq, header.kind, header.model, header.version) == (7, "infer", "m", "1")
    np.testing.assert_array_equal(rows, x)
    assert b"pickle" not in bytes(frames[0]) and len(bytes(frames[1])) == x.nbytes
    outputs = {"logits": np.ones((2, 5), np.float32), "ids": np.arange(2, dtype=np.int64)}
    header, got = wire.read_reply([bytes(f) for f in wire.reply(7, outputs, batch_id=3, batch_rows=9)])
    assert header.status == "ok" and (header.batch_id, header.batch_rows) == (3, 9)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in outputs.items()}


@pytest.fixture()
def engine(tmp_path):
    """An engine process over a repository holding the committed model; yields its endpoint."""
    shutil.copytree(DEFAULT, tmp_path / "artifacts" / "digits-lenet5" / "1")
    endpoint = f"ipc://{tmp_path / 'engine.sock'}"
    argv = [sys.executable, "-m", "service.engine", "--endpoint", endpoint, "--artifacts", str(tmp_path / "artifacts")]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield endpoint, process
    finally:
        process.terminate()
        assert process.wait(30) == 0, "SIGTERM drains the engine and it exits 0"


def test_the_engine_answers_as_the_in_process_sessions_and_routes_each_reply_to_its_request(engine):
    endpoint, _ = engine
    x = load_dataset("digits").test.x[:200]
    runtime = create_runtime(DEFAULT / "model.onnx", Settings(), 1)

    async def scenario():
        client = EngineClient(endpoint)
        await client.start(wait=60)
        try:
            alone = [await client.submit("digits-lenet5", "1", x[i : i + 5]) for i in range(0, 20, 5)]
            together = await asyncio.gather(*(client.submit("digits-lenet5", "1", x[i : i + 1]) for i in range(200)))
            with pytest.raises(ModelNotFound, match="no model 'nope'"):
                await client.submit("nope", "1", x[:1])
            return alone, together
        finally:
            await client.stop()

    alone, together = asyncio.run(scenario())
    for i, (outputs, timing) in enumerate(alone):
        reference = runtime.run(x[i * 5 : i * 5 + 5])
        assert timing.batch_rows == 5 and timing.batch_id >= 1
        for name in ("logits", "probabilities"):
            np.testing.assert_array_equal(outputs[name], reference[name])  # the same batch: bit for bit
    reference = runtime.run(x)
    for i, (outputs, _) in enumerate(together):
        np.testing.assert_allclose(outputs["probabilities"], reference["probabilities"][i : i + 1], atol=1e-6)
    assert max(timing.batch_rows for _, timing in together) > 1, "concurrent requests share batches"


def _sleepy(seconds: float, max_queue_rows: int = 4096) -> DynamicBatcher:
    def run(x):
        time.sleep(seconds)
        return {"probabilities": np.full((len(x), 2), 0.5, np.float32)}

    return DynamicBatcher([run], BatchingConfig(max_batch_size=4, max_queue_rows=max_queue_rows, instances=1), "s:1")


def test_a_full_engine_queue_answers_overloaded_with_its_retry_after(tmp_path):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"

    async def scenario():
        server = EngineServer({("s", "1"): _sleepy(0.3, max_queue_rows=4)}, endpoint)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        try:
            x = np.zeros((4, 3), np.float32)
            results = await asyncio.gather(*(client.submit("s", "1", x) for _ in range(3)), return_exceptions=True)
        finally:
            await client.stop()
            server.stop()
            await serving
        return results

    results = asyncio.run(scenario())
    refused = [r for r in results if isinstance(r, Overloaded)]
    assert refused and refused[0].headers["Retry-After"] == "1" and "rows queued" in refused[0].message
    assert any(isinstance(r, tuple) for r in results)


def test_a_failed_batch_answers_each_of_its_requests_and_is_logged_once(tmp_path, caplog):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"

    def run(x):
        raise RuntimeError("the session broke")

    async def scenario():
        batcher = DynamicBatcher([run], BatchingConfig(max_batch_size=64, instances=1), "f:1")
        server = EngineServer({("f", "1"): batcher}, endpoint)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        try:
            x = np.zeros((1, 3), np.float32)
            return await asyncio.gather(*(client.submit("f", "1", x) for _ in range(6)), return_exceptions=True)
        finally:
            await client.stop()
            server.stop()
            await serving

    with caplog.at_level(logging.INFO):
        results = asyncio.run(scenario())
    assert all(isinstance(r, Exception) and "the session broke" in str(r) for r in results), results
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    batch_sizes = [
        int(re.fullmatch(r"inference failed for model f:1 on a batch of (\d+) requests", m)[1]) for m in failures
    ]
    assert sum(batch_sizes) == 6, f"one line per failed batch, none per request: {failures}"


ENGINE_SCRIPT = textwrap.dedent(
    """
    import asyncio, signal, sys, time
    import numpy as np
    from service.engine.server import EngineServer
    from service.serving.batching import DynamicBatcher
    from service.settings import BatchingConfig

    def run(x):
        time.sleep(float(sys.argv[2]))
        return {"probabilities": np.full((len(x), 2), 0.5, np.float32)}

    async def main():
        server = EngineServer({("s", "1"): DynamicBatcher([run], BatchingConfig(instances=1), "s:1")}, sys.argv[1])
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
        await server.serve()

    asyncio.run(main())
    """
)


def test_a_killed_engine_fails_waiting_requests_at_once_and_serves_again_when_restarted(tmp_path):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)

    def start(seconds: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), endpoint, seconds], cwd=ROOT, env=dict(os.environ))

    first = start("5")

    async def scenario():
        client = EngineClient(endpoint)
        await client.start(wait=30)
        x = np.zeros((1, 3), np.float32)
        waiting = [asyncio.ensure_future(client.submit("s", "1", x)) for _ in range(3)]
        await asyncio.sleep(0.3)  # every request is in the engine, the first in a 5-second batch
        killed = time.monotonic()
        first.send_signal(signal.SIGKILL)
        failed = await asyncio.gather(*waiting, return_exceptions=True)
        failed_after = time.monotonic() - killed
        with pytest.raises(EngineUnavailable):
            await client.submit("s", "1", x)
        second = start("0")
        try:
            deadline = time.monotonic() + 30
            while not client.ready and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            outputs, _ = await client.submit("s", "1", x)
        finally:
            await client.stop()
            second.terminate()
            code = second.wait(30)
        return failed, failed_after, outputs, code

    failed, failed_after, outputs, code = asyncio.run(scenario())
    first.wait(10)
    assert all(isinstance(f, EngineUnavailable) for f in failed), failed
    assert failed_after < 1.0, f"waiting requests failed {failed_after:.2f} s after the kill"
    assert failed[0].status == 503 and failed[0].headers["Retry-After"] == "1"
    np.testing.assert_array_equal(outputs["probabilities"], [[0.5, 0.5]])
    assert code == 0


def test_the_number_of_front_ends_is_a_count_or_auto_sized_to_the_cores_where_cuda_runs(monkeypatch):
    from pydantic import ValidationError

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("service.serving.runtime.cuda_wanted", lambda device: device == "cuda")
    assert Settings(frontends=3).frontend_count() == 3
    assert Settings(frontends="auto", device="cuda").frontend_count() == 7
    assert Settings(frontends="auto", device="cpu").frontend_count() == 1
    monkeypatch.setenv("CALIB_FRONTENDS", "auto")
    assert Settings().frontends == "auto"
    for wrong in (0, "many"):
        with pytest.raises(ValidationError, match="frontends"):
            Settings(frontends=wrong)
