"""ModelRuntime's buckets: their sizes, the staging buffers a batch is copied into once, the I/O binding bound once on
fixed buffers, oversize batches on a session no bucket uses, and CUDA graphs that fall back when their capture fails.

Every result is onnxruntime's, on the CPU. Where a test must see which session ran what, ``_new_session`` makes
``RecordingSession``s: real CPU sessions that record each run, and that can say they run on CUDA and fail when created
with CUDA graphs or at their capture (a CUDA build is not needed, and the graphs themselves are not run here)."""

from __future__ import annotations

import logging
import threading
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from service.engine.server import runtime_facts
from service.serving import buckets as buckets_module
from service.serving import runtime
from service.serving.repository import ModelRepository
from service.serving.runtime import CPU, CUDA, batch_buckets, create_runtime
from service.settings import Settings

MODEL = Path(__file__).resolve().parents[3] / "artifacts" / "digits-lenet5" / "1" / "model.onnx"
ROW = (1, 8, 8)
PADDED = {"pad_batches": "on", "bucket_sessions": "on"}


def rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((count, *ROW), dtype=np.float32)


def unpadded(x: np.ndarray) -> dict[str, np.ndarray]:
    """The outputs of a plain session run on exactly these rows."""
    session = ort.InferenceSession(str(MODEL), providers=[CPU])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"input": x})))


def assert_outputs_equal(got: dict, expected: dict, tolerance: float = 1e-6) -> None:
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].shape == expected[name].shape
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=tolerance)


class RecordingBinding:
    """An ``IOBinding`` that remembers the rows and buffer address of the input bound to it."""

    def __init__(self, binding):
        self.real, self.rows, self.address = binding, None, None

    def bind_ortvalue_input(self, name, value):
        self.rows, self.address = value.shape()[0], value.data_ptr()
        self.real.bind_ortvalue_input(name, value)

    def bind_cpu_input(self, name, array):
        self.rows, self.address = len(array), array.ctypes.data
        self.real.bind_cpu_input(name, array)

    def __getattr__(self, name):
        return getattr(self.real, name)


class RecordingSession:
    """A CPU session recording each run as (session, "run" or "binding", rows, binding, input address, thread)."""

    def __init__(self, path, options, providers, calls, cuda=False, fail_capture=False):
        self.real = ort.InferenceSession(str(path), options, providers=[CPU])
        self.graph = any(isinstance(p, tuple) and p[1].get("enable_cuda_graph") == "1" for p in providers)
        self.calls, self.cuda, self.fail_capture = calls, cuda, fail_capture

    def get_providers(self):
        return [CUDA, CPU] if self.cuda else self.real.get_providers()

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def run(self, names, feeds, *args):
        (x,) = feeds.values()
        self.calls.append((self, "run", len(x), None, None, threading.get_ident()))
        return self.real.run(names, feeds, *args)

    def io_binding(self):
        return RecordingBinding(self.real.io_binding())

    def run_with_iobinding(self, binding, *args):
        if self.graph and self.fail_capture:
            raise RuntimeError("CUDA failure 901: operation failed due to a previous error during capture")
        self.calls.append((self, "binding", binding.rows, binding, binding.address, threading.get_ident()))
        self.real.run_with_iobinding(binding.real, *args)


@pytest.fixture
def sessions(monkeypatch):
    """``install(cuda=False, fail=None)``: ``create_runtime`` makes RecordingSessions, whose calls it returns; with
    ``cuda`` they say they run on CUDA (on a build that has it and a machine with a GPU, their buffers on the CPU);
    ``fail`` "create" or "capture" fails sessions made with CUDA graphs then."""
    calls: list[tuple] = []

    def install(cuda=False, fail=None):
        def new_session(path, options, providers):
            session = RecordingSession(path, options, providers, calls, cuda, fail_capture=fail == "capture")
            if session.graph and fail == "create":
                raise RuntimeError("This session cannot use the CUDA graph: not every node runs on CUDA")
            return session

        monkeypatch.setattr(runtime, "_new_session", new_session)
        if cuda:
            fake = types.SimpleNamespace(**{name: getattr(ort, name) for name in dir(ort) if not name.startswith("_")})
            fake.get_available_providers = lambda: [CUDA, CPU]
            monkeypatch.setattr(runtime, "ort", fake)
            monkeypatch.setattr(runtime, "nvidia_device_present", lambda: True)
            monkeypatch.setattr(runtime, "ortvalue_device", lambda provider: "cpu")
        return calls

    return install


def test_buckets_are_the_powers_of_two_up_to_the_step_then_every_step_rows():
    assert batch_buckets(64, 8) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert batch_buckets(64, 0) == batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets(20, 6) == (1, 2, 4, 6, 12, 18, 20)
    assert batch_buckets(6, 8) == (1, 2, 4, 6) and batch_buckets(1, 8) == batch_buckets(1) == (1,)
    assert batch_buckets(5, 1) == (1, 2, 3, 4, 5)
    assert Settings().runtime.bucket_step == 8
    assert create_runtime(MODEL, Settings(runtime=PADDED), max_batch_size=64).buckets == batch_buckets(64, 8)
    powers = create_runtime(MODEL, Settings(runtime={**PADDED, "bucket_step": 0}), max_batch_size=64)
    assert powers.buckets == batch_buckets(64, 0)


def test_every_batch_size_runs_on_the_smallest_bucket_that_holds_it(sessions):
    calls = sessions()
    padded = create_runtime(MODEL, Settings(runtime=PADDED), max_batch_size=64)
    calls.clear()
    for count in range(1, 65):
        padded.run(rows(count, count))
        session, _, ran, *_ = calls[-1]
        bucket = min(b for b in padded.buckets if b >= count)
        assert (ran, session) == (bucket, padded.bucket_sessions[bucket])
    assert len(calls) == 64


@pytest.mark.parametrize("io_binding", ["on", "off"])
@pytest.mark.parametrize("own", ["on", "off"])
def test_staged_batches_give_the_outputs_of_an_unpadded_run(io_binding, own, monkeypatch):
    monkeypatch.setattr(runtime, "IO_BINDING", io_binding)
    padded = create_runtime(MODEL, Settings(runtime={**PADDED, "bucket_sessions": own}), max_batch_size=64)
    assert padded.io_binding is (io_binding == "on") and bool(padded.bucket_sessions) is (own == "on")
    eight = padded.bucket_runs[padded.buckets.index(8)]
    # each batch after the first lands in a bucket whose buffer held more rows the time before
    for count in (7, 5, 4, 3, 16, 9, 24, 17, 2, 1, 64, 33, 40, 6, 64, 57, 23, 8, 5):
        x = rows(count, count)
        expected = unpadded(x)
        assert_outputs_equal(padded.run(x), expected)
        cuts = sorted(np.random.default_rng(count).integers(0, count + 1, 2))
        assert_outputs_equal(padded.run([x[: cuts[0]], x[cuts[0] : cuts[1]], x[cuts[1] :]]), expected)
        if count == 5:
            assert eight.filled == 5 and not eight.staging[5:].any()  # the rows of 7 or 8 before, zeroed beyond 5


@pytest.mark.parametrize("io_binding", ["on", "off"])
def test_the_arrays_returned_are_not_written_by_the_next_call(io_binding, monkeypatch):
    monkeypatch.setattr(runtime, "IO_BINDING", io_binding)
    padded = create_runtime(MODEL, Settings(runtime=PADDED), max_batch_size=16)
    first = padded.run(rows(6, 1))
    kept = {name: value.copy() for name, value in first.items()}
    padded.run(rows(7, 2))  # the same bucket, its buffers reused
    for name in kept:
        np.testing.assert_array_equal(first[name], kept[name])


def test_a_persistent_binding_runs_on_the_same_buffers_at_every_call(sessions, monkeypatch):
    calls = sessions()
    monkeypatch.setattr(runtime, "IO_BINDING", "on")
    padded = create_runtime(MODEL, Settings(runtime=PADDED), max_batch_size=16)
    for count in (3, 4, 2, 3, 16, 9):
        padded.run(rows(count, count))
    bound = {}
    for session, how, ran, binding, address, _ in calls:
        assert how == "binding" and ran == next(b.size for b in padded.bucket_runs if b.session is session)
        bound.setdefault(session, set()).add((id(binding), address))
    assert all(len(pairs) == 1 for pairs in bound.values())  # one binding and one input buffer per session
    assert padded.staging_bytes == sum(b.nbytes for b in padded.bucket_runs) > 0
    assert padded.staging_bytes == 2 * 4 * sum(padded.buckets) * int(np.prod(ROW)) + 2 * 4 * sum(padded.buckets) * 10


@pytest.mark.parametrize("own", ["on", "off"])
def test_batches_larger_than_every_bucket_never_reach_a_bucket_session(sessions, own, monkeypatch):
    calls = sessions()
    monkeypatch.setattr(runtime, "IO_BINDING", "on")
    padded = create_runtime(MODEL, Settings(runtime={**PADDED, "bucket_sessions": own}), max_batch_size=8)
    assert padded.buckets == (1, 2, 4, 8)
    calls.clear()
    for count in (9, 20, 8, 13):
        x = rows(count, count)
        assert_outputs_equal(padded.run([x[:5], x[5:]]), unpadded(x))
    oversize = [(session, ran) for session, _, ran, *_ in calls if ran not in padded.buckets]
    assert [ran for _, ran in oversize] == [9, 20, 13]
    assert all(session is padded.session for session, _ in oversize)
    if own == "on":
        assert padded.session not in padded.bucket_sessions.values()
        assert all(session is not padded.session for session, _, ran, *_ in calls if ran in padded.buckets)


def test_rows_of_no_fixed_shape_get_their_buffers_at_the_first_batch(tmp_path, monkeypatch):
    path = tmp_path / "softmax.onnx"
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["input"], ["logits"]),
            helper.make_node("Softmax", ["input"], ["probabilities"]),
        ],
        "softmax",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "classes"])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "classes"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", "classes"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    monkeypatch.setattr(runtime, "IO_BINDING", "on")
    padded = create_runtime(path, Settings(runtime=PADDED), max_batch_size=8)
    assert padded.staging_bytes == 0  # nothing allocated before the rows' shape is known
    x = np.random.default_rng(0).random((3, 5), dtype=np.float32)
    got = padded.run(x)
    np.testing.assert_array_equal(got["logits"], x)
    np.testing.assert_allclose(got["probabilities"], np.exp(x) / np.exp(x).sum(axis=1, keepdims=True), rtol=1e-6)
    assert padded.bucket_runs[2].staging.shape == (4, 5) and padded.staging_bytes > 0


def test_cuda_graphs_run_every_bucket_on_fixed_buffers_on_one_thread_of_their_own(sessions):
    calls = sessions(cuda=True)
    graphs = create_runtime(MODEL, Settings(device="cuda", runtime={"cuda_graphs": True}), max_batch_size=8)
    assert (graphs.provider, graphs.io_binding, graphs.buckets) == (CUDA, True, (1, 2, 4, 8))  # auto on CUDA
    assert (graphs.cuda_graphs, graphs.graph_fallback) == (True, "")
    assert all(s.graph for s in graphs.bucket_sessions.values()) and not graphs.session.graph
    assert graphs.warmup_seconds > 0
    for count in (3, 8, 1, 2, 4, 7, 11):
        x = rows(count, count)
        assert_outputs_equal(graphs.run(x), unpadded(x))
    on_graphs = [call for call in calls if call[0].graph]
    assert {how for _, how, *_ in on_graphs} == {"binding"}  # never session.run, never a batch bound per call
    for session in graphs.bucket_sessions.values():
        assert len({(id(binding), address) for s, _, _, binding, address, _ in on_graphs if s is session}) == 1
    threads = {thread for *_, thread in on_graphs}
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert [ran for s, how, ran, *_ in calls if s is graphs.session and how == "binding"] == [11]  # the oversize one


@pytest.mark.parametrize(
    "fail, where", [("capture", "capturing the 1-row bucket"), ("create", "creating a bucket session")]
)
def test_a_failed_graph_capture_falls_back_to_sessions_without_graphs(sessions, fail, where, caplog):
    sessions(cuda=True, fail=fail)
    with caplog.at_level(logging.WARNING, logger="service.serving.runtime"):
        served = create_runtime(MODEL, Settings(device="cuda", runtime={"cuda_graphs": True}), max_batch_size=8)
    assert served.cuda_graphs is False and served.graph_thread is None
    assert served.graph_fallback.startswith(f"CUDA graphs failed {where}: ")
    assert ("CUDA failure 901" if fail == "capture" else "not every node runs on CUDA") in served.graph_fallback
    assert sorted(served.bucket_sessions) == [1, 2, 4, 8]
    assert not any(s.graph for s in served.bucket_sessions.values())
    assert any(served.graph_fallback in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for count in (3, 8, 1, 9):
        x = rows(count, count)
        assert_outputs_equal(served.run(x), unpadded(x))


def test_cuda_graphs_asked_for_where_they_cannot_run_say_why():
    on_cpu = create_runtime(MODEL, Settings(runtime={"cuda_graphs": True, **PADDED}), max_batch_size=8)
    assert on_cpu.cuda_graphs is False and on_cpu.graph_fallback == f"the sessions run on {CPU}, not CUDA"
    assert create_runtime(MODEL, Settings(), max_batch_size=8).graph_fallback == ""  # not asked for


def test_the_repository_warms_every_bucket_and_the_facts_report_the_cost(tmp_path, linear_artifact, monkeypatch):
    linear_artifact(tmp_path, "toy", "1")
    (tmp_path / "toy" / "serving.json").write_text('{"max_batch_size": 16, "instances": 2}')
    seen = []
    original = buckets_module.Bucket.run
    monkeypatch.setattr(
        buckets_module.Bucket, "run", lambda self, parts, count: seen.append(id(self)) or original(self, parts, count)
    )
    repository = ModelRepository(Settings(artifacts=tmp_path, runtime={"pad_batches": "on"}))
    repository.load()
    runtimes = repository.get("toy").runtimes
    assert sorted(seen) == sorted(id(b) for r in runtimes for b in r.bucket_runs)
    assert all(r.buckets == (1, 2, 4, 8, 16) and r.warmup_seconds > 0 for r in runtimes)
    facts = runtime_facts(runtimes)
    assert (facts["cuda_graphs"], facts["graph_fallback"]) == (False, "")
    assert facts["staging_bytes"] == sum(r.staging_bytes for r in runtimes) > 0
    assert facts["warmup_seconds"] == sum(r.warmup_seconds for r in runtimes)
