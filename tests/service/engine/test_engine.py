"""The engine process and a front-end's client (service.engine): outputs equal to the in-process sessions', replies
routed to their requests, the engine's refusals relayed as the service's errors, and a dead engine failing every
waiting request at once, then served again once it is back."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq

from service.engine import wire
from service.engine.client import EngineClient
from service.engine.frontend import FIRST_WINDOW, EngineBatcher, RemoteRuntime
from service.engine.health import EngineFault, sticky_device_error
from service.engine.pod import frontend_count
from service.engine.server import EngineServer
from service.errors import DeadlineExceeded, EngineUnavailable, ModelNotFound, Overloaded
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
    monkeypatch.setattr("service.engine.pod.cuda_wanted", lambda device: device == "cuda")
    assert frontend_count(Settings(frontends=3)) == 3
    assert frontend_count(Settings(frontends="auto", device="cuda")) == 7
    assert frontend_count(Settings(frontends="auto", device="cpu")) == 1
    monkeypatch.setenv("CALIB_FRONTENDS", "auto")
    assert Settings().frontends == "auto"
    for wrong in (0, "many"):
        with pytest.raises(ValidationError, match="frontends"):
            Settings(frontends=wrong)


def _gated(deadline: float = 30.0) -> tuple[DynamicBatcher, threading.Event]:
    """A batcher whose session waits for the returned event (a stuck session until the test sets it)."""
    gate = threading.Event()

    def run(x):
        gate.wait(30)
        return {"probabilities": np.full((len(x), 2), 0.5, np.float32)}

    config = BatchingConfig(max_batch_size=4, deadline_seconds=deadline, instances=1)
    return DynamicBatcher([run], config, "g:1"), gate


def _front_end(client: EngineClient, deadline: float, model: str = "g", max_window: int = 2) -> EngineBatcher:
    """A front-end's batcher for version 1 of ``model`` over ``client``, with the given deadline."""
    facts = {
        "provider": "CPUExecutionProvider",
        "requested": [],
        "io_binding": False,
        "buckets": [],
        "bucket_sessions": False,
        "sessions": 1,
        "output_names": ["probabilities"],
    }
    remote = RemoteRuntime(facts, client, model, "1", deadline)
    config = BatchingConfig(max_batch_size=4, deadline_seconds=deadline)
    return EngineBatcher(remote, config, f"{model}:1", max_window=max_window)


def test_a_front_end_answers_503_at_its_deadline_and_serves_the_next_request_once_the_engine_is_back(tmp_path):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    batcher, gate = _gated()

    async def scenario():
        server = EngineServer({("g", "1"): batcher}, endpoint)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        front = _front_end(client, deadline=0.5)
        front.start()
        try:
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded) as refused:
                await front.submit(np.zeros((1, 3), np.float32))
            waited = time.monotonic() - started
            await asyncio.sleep(0.3)  # a ping reports the engine's batch still running
            stalled = client.stalled_seconds
            gate.set()
            outputs, _ = await front.submit(np.zeros((1, 3), np.float32))
            return refused.value, waited, stalled, outputs
        finally:
            await front.stop()
            await client.stop()
            server.stop()
            await serving

    refused, waited, stalled, outputs = asyncio.run(scenario())
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert 0.5 <= waited < 1.5, f"the 503 came {waited:.2f} s after the request, with a deadline of 0.5 s"
    assert stalled > 0.3, "the engine's pings report how long its running batch has run"
    np.testing.assert_array_equal(outputs["probabilities"], [[0.5, 0.5]])


def test_a_lost_reply_answers_503_at_the_deadline_and_the_next_request_is_served(tmp_path, monkeypatch):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    server = EngineServer({("s", "1"): _sleepy(0.0)}, endpoint)
    send, lost = server._send, []

    def losing(router, frames):
        if not lost and len(frames) > 2:  # the first reply that carries outputs goes nowhere
            lost.append(frames)
            return
        send(router, frames)

    monkeypatch.setattr(server, "_send", losing)

    async def scenario():
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        front = _front_end(client, deadline=0.5, model="s")
        front.start()
        try:
            with pytest.raises(DeadlineExceeded):
                await front.submit(np.zeros((1, 3), np.float32))
            return await front.submit(np.zeros((1, 3), np.float32))
        finally:
            await front.stop()
            await client.stop()
            server.stop()
            await serving

    outputs, _ = asyncio.run(scenario())
    assert lost and outputs["probabilities"].shape == (1, 2)


def test_a_malformed_request_gets_an_error_reply_and_the_engine_serves_on(tmp_path):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    server = EngineServer({("s", "1"): _sleepy(0.0)}, endpoint)
    thread = threading.Thread(target=server.run)
    thread.start()
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        header = wire.Request(5, "infer", "s", "1", wire.Tensor("rows", "<f4", [2, 3]))
        replies = []
        for frames in (
            [b"not msgpack at all"],
            [msgspec.msgpack.encode(header), b"\0" * 5],
            wire.request(6, "s", "1", np.zeros((1, 3), np.float32)),
        ):
            socket.send_multipart(frames)
            assert socket.poll(5000), "every message is answered"
            replies.append(wire.read_reply(socket.recv_multipart()))
    finally:
        socket.close()
        server.stop()
        thread.join(10)
    (garbage, _), (short, _), (fine, outputs) = replies
    assert (garbage.seq, garbage.status) == (0, "invalid") and "malformed" in garbage.message
    assert (short.seq, short.status) == (5, "invalid"), "the sender's sequence number, so its request fails at once"
    assert (fine.seq, fine.status) == (6, "ok") and outputs["probabilities"].shape == (1, 2)


@pytest.mark.parametrize("fault", ["stuck", "sticky"])
def test_an_engine_that_cannot_serve_again_ends_with_a_fault_and_its_requests_get_503(tmp_path, fault):
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    if fault == "stuck":
        batcher, gate = _gated(deadline=0.4)
    else:
        gate = threading.Event()

        def run(x):
            raise RuntimeError(
                "[ONNXRuntimeError] : 1 : FAIL : CUDA failure 700: an illegal memory access was encountered"
            )

        batcher = DynamicBatcher([run], BatchingConfig(max_batch_size=4, instances=1), "g:1")

    async def scenario():
        server = EngineServer({("g", "1"): batcher}, endpoint)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        try:
            answer = await asyncio.gather(client.submit("g", "1", np.zeros((1, 3), np.float32)), return_exceptions=True)
            with pytest.raises(EngineFault, match="past its 0.4 s deadline" if fault == "stuck" else "illegal memory"):
                await asyncio.wait_for(serving, 5)
            return answer[0]
        finally:
            gate.set()
            await client.stop()

    answer = asyncio.run(scenario())
    assert isinstance(answer, EngineUnavailable), answer  # a sticky error's reply, or the socket's end when stuck
    assert answer.status == 503


def test_sticky_device_errors_are_told_from_the_others():
    sticky = [
        "CUDA failure 700: an illegal memory access was encountered ; GPU=0 ; hostname=h ; file=f ; line=1",
        "CUDA failure 719: unspecified launch failure",
        "CUDA error cudaErrorECCUncorrectable: uncorrectable ECC error encountered",
    ]
    recoverable = [
        "CUDA failure 2: out of memory ; GPU=0",
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Invalid rank for input",
        "CUDNN failure 4: CUDNN_STATUS_INTERNAL_ERROR",
    ]
    assert all(sticky_device_error(RuntimeError(m)) for m in sticky)
    assert not any(sticky_device_error(RuntimeError(m)) for m in recoverable)


def test_ten_times_overload_is_refused_in_milliseconds_with_bounded_queues_and_no_wait_past_the_deadline(tmp_path):
    """Two front-ends, each queueing its share of the pod's bound (8 of 16 rows), offer single rows at ten times what
    a slow model serves (4 rows per 20 ms); the refusals are immediate, the queues never pass their bounds, and no
    accepted request waits past its deadline."""
    endpoint = f"ipc://{tmp_path / 'e.sock'}"
    engine_batcher = _sleepy(0.02)
    deadline, offered, seconds = 1.0, 2000, 1.0  # 2,000 rows/s against 200

    async def scenario():
        server = EngineServer({("s", "1"): engine_batcher}, endpoint)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        fronts = [_front_end(client, deadline, model="s") for _ in range(2)]
        for front in fronts:
            front.config = front.config.model_copy(update={"max_queue_rows": 8})
            front.start()
        queued = {"front": 0, "engine": 0}
        outcomes: list[tuple[str, float]] = []

        async def one(i: int) -> None:
            started = time.monotonic()
            try:
                await fronts[i % 2].submit(np.zeros((1, 3), np.float32))
                outcomes.append(("ok", time.monotonic() - started))
            except (Overloaded, DeadlineExceeded) as exc:
                outcomes.append((type(exc).__name__, time.monotonic() - started))
            queued["front"] = max([queued["front"], *(f.queued_rows for f in fronts)])
            queued["engine"] = max(queued["engine"], engine_batcher.queued_rows)

        try:
            tasks = []
            for i in range(offered):
                tasks.append(asyncio.ensure_future(one(i)))
                await asyncio.sleep(seconds / offered)
            await asyncio.gather(*tasks)
        finally:
            for front in fronts:
                await front.stop()
            await client.stop()
            server.stop()
            await serving
        return outcomes, queued

    outcomes, queued = asyncio.run(scenario())
    served = [t for kind, t in outcomes if kind == "ok"]
    refused = sorted(t for kind, t in outcomes if kind == "Overloaded")
    assert len(outcomes) == offered and served and len(refused) > offered / 2, "most of a 10x overload is refused"
    assert refused[len(refused) // 2] < 0.005 and refused[int(0.99 * len(refused))] < 0.05, "refusals at once"
    assert max(t for _, t in outcomes) < deadline + 0.25, "no request waits past its deadline"
    assert queued["front"] <= 8, "each front-end's queue stays within its share"
    assert queued["engine"] <= 2 * 2 * 4, "the engine holds at most the front-ends' windows of batches"


def test_the_front_end_window_widens_while_the_engine_runs_dry_and_narrows_while_its_queue_holds_full_batches():
    most = 6
    front = _front_end(EngineClient("ipc:///nowhere"), deadline=1.0, max_window=most)  # never started
    assert front.window == FIRST_WINDOW
    front._queued_rows = 3  # this front-end has requests waiting
    for _ in range(most + 2):
        front._replied(0.0, queued_rows=0)
    assert front.window == most, "an empty engine queue with work waiting here widens the window to its top"
    front._replied(0.0, queued_rows=1)  # some rows queued, less than a batch per session: kept
    assert front.window == most
    for _ in range(most + 2):
        front._replied(0.0, queued_rows=4)  # a full batch (4 rows) queued for the engine's one session
    assert front.window == 1
    front._queued_rows = 0
    front._replied(0.0, queued_rows=0)
    assert front.window == 1, "an idle engine with nothing waiting here is no reason to widen"


def test_the_engine_timeline_records_each_batch_once_its_replies_are_sent(tmp_path):
    endpoint, line = f"ipc://{tmp_path / 'e.sock'}", tmp_path / "timeline.jsonl"

    async def scenario():
        server = EngineServer({("s", "1"): _sleepy(0.01)}, endpoint, timeline=line)
        serving = asyncio.ensure_future(server.serve())
        client = EngineClient(endpoint)
        await client.start(wait=10)
        try:
            x = np.zeros((1, 3), np.float32)
            return await asyncio.gather(*(client.submit("s", "1", x) for _ in range(12)))
        finally:
            await client.stop()
            server.stop()
            await serving

    answers = asyncio.run(scenario())
    entries = [json.loads(text) for text in line.read_text().splitlines()]
    assert sorted(e["batch"] for e in entries) == sorted({timing.batch_id for _, timing in answers})
    assert sum(e["rows"] for e in entries) == 12
    for e in entries:
        assert e["back"] <= e["taken"] <= e["ran"] <= e["answered"] <= e["sent"]
        assert e["model"] == "s:1" and e["queued_back"] >= 0 and e["queued_after"] >= 0
