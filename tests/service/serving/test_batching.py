"""Dynamic batching: fewer onnxruntime calls, identical results, a bounded queue, draining on stop."""

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest

from bench.common import loopback
from service.errors import DeadlineExceeded, NotReady, Overloaded
from service.serving.batching import DynamicBatcher
from service.settings import BatchingConfig, Settings


class CountingModel:
    """A deterministic 'model' (row sums and squares) that records every batch it is called with."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[int] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        with self.lock:
            self.calls.append(len(x))
        time.sleep(self.delay)
        flat = x.reshape(len(x), -1)
        return {"sum": flat.sum(axis=1, keepdims=True), "square": flat**2}


async def _submit_all(batcher, inputs):
    return await asyncio.gather(*(batcher.submit(x) for x in inputs))


def test_concurrent_requests_share_calls_and_get_their_own_rows():
    async def scenario():
        model = CountingModel(delay=0.005)
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=16, max_queue_delay_ms=5), "m")
        batcher.start()
        rng = np.random.default_rng(0)
        inputs = [rng.random((int(rng.integers(1, 4)), 2, 2)).astype(np.float32) for _ in range(40)]
        results = await _submit_all(batcher, inputs)
        await batcher.stop()
        return model, inputs, results

    model, inputs, results = asyncio.run(scenario())
    assert sum(model.calls) == sum(len(x) for x in inputs)
    assert len(model.calls) < len(inputs) / 3
    assert max(model.calls) <= 16
    for x, (outputs, timing) in zip(inputs, results):
        unbatched = CountingModel()(x)
        for name in unbatched:
            np.testing.assert_array_equal(outputs[name], unbatched[name])
        assert timing.batch_rows >= len(x) and timing.queue_seconds >= 0


def test_a_request_larger_than_the_batch_runs_alone():
    async def scenario():
        model = CountingModel()
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=4, max_queue_delay_ms=1), "m")
        batcher.start()
        ((outputs, _),) = await _submit_all(batcher, [np.ones((10, 1, 1), np.float32)])
        await batcher.stop()
        return model, outputs

    model, outputs = asyncio.run(scenario())
    assert model.calls == [10] and outputs["sum"].shape == (10, 1)


def test_full_queue_refuses_with_overloaded():
    async def scenario():
        model = CountingModel(delay=0.05)
        batcher = DynamicBatcher(
            model, BatchingConfig(max_batch_size=2, max_queue_delay_ms=0, max_queue_rows=4), "m", retry_after=3
        )
        batcher.start()
        outcomes = await asyncio.gather(
            *(batcher.submit(np.ones((2, 1, 1), np.float32)) for _ in range(6)), return_exceptions=True
        )
        await batcher.stop()
        return outcomes

    outcomes = asyncio.run(scenario())
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert 1 <= len(refused) < 6 and all(not isinstance(o, Exception) or isinstance(o, Overloaded) for o in outcomes)
    assert refused[0].headers == {"Retry-After": "3"} and "rows queued (limit 4)" in refused[0].message


def test_stop_finishes_queued_work_then_refuses():
    async def scenario():
        model = CountingModel(delay=0.01)
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=2, max_queue_delay_ms=50), "m")
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit(np.ones((1, 1, 1), np.float32))) for _ in range(7)]
        await asyncio.sleep(0)
        await batcher.stop()
        done = [p.result() for p in pending]
        with pytest.raises(NotReady):
            await batcher.submit(np.ones((1, 1, 1), np.float32))
        return done

    assert len(asyncio.run(scenario())) == 7


def test_an_inference_failure_answers_every_waiting_request():
    def broken(x):
        raise RuntimeError("boom")

    async def scenario():
        batcher = DynamicBatcher(broken, BatchingConfig(max_batch_size=8, max_queue_delay_ms=5), "m")
        batcher.start()
        outcomes = await asyncio.gather(
            *(batcher.submit(np.ones((1, 1), np.float32)) for _ in range(3)), return_exceptions=True
        )
        await batcher.stop()
        return outcomes

    assert all(isinstance(o, RuntimeError) for o in asyncio.run(scenario()))


def test_without_an_event_loop_callbacks_get_their_rows_on_the_inference_thread_and_refusals_are_raised():
    gate = threading.Event()
    model = CountingModel()

    def gated(x):
        gate.wait(10)
        return model(x)

    batcher = DynamicBatcher(gated, BatchingConfig(max_batch_size=8, max_queue_rows=12), "m")
    batcher.start()  # no running loop: submit_nowait's callbacks only
    answers: dict[int, tuple] = {}
    done = threading.Event()

    def answer(i: int):
        def callback(outputs, timing, exc) -> None:
            answers[i] = (outputs, timing, exc, threading.current_thread().name)
            if len(answers) == 13:
                done.set()

        return callback

    inputs = [np.full((1, 2), i, np.float32) for i in range(14)]
    batcher.submit_nowait(inputs[0], answer(0))
    deadline = time.monotonic() + 10
    while batcher.queued_rows and time.monotonic() < deadline:  # the inference thread took it and waits at the gate
        time.sleep(0.001)
    for i in range(1, 13):
        batcher.submit_nowait(inputs[i], answer(i))
    with pytest.raises(Overloaded):  # 12 rows queued: the 13th is refused at once, and never answered
        batcher.submit_nowait(inputs[13], answer(13))
    gate.set()
    assert done.wait(10) and 13 not in answers
    for i, (outputs, timing, exc, thread) in answers.items():
        assert exc is None and thread.startswith("infer-m")
        np.testing.assert_array_equal(outputs["sum"], [[2.0 * i]])
        assert 1 <= timing.batch_rows <= 8 and timing.batch_id >= 1
    assert model.calls == [1, 8, 4]  # the first alone, then the queue in batches of at most 8
    batcher.close()
    batcher.join()
    with pytest.raises(NotReady):
        batcher.submit_nowait(inputs[0], answer(0))

    failed = threading.Event()

    def broken(x):
        raise RuntimeError("boom")

    batcher = DynamicBatcher(broken, BatchingConfig(), "b")
    batcher.start()
    batcher.submit_nowait(inputs[0], lambda o, t, exc: failed.set() if isinstance(exc, RuntimeError) else None)
    assert failed.wait(10)
    batcher.close()
    batcher.join()


def _batch_metrics(base_url: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    count = total = 0.0
    for family in text_string_to_metric_families(loopback.get(f"{base_url}/metrics").text):
        if family.name == "calib_batch_size_rows":
            for sample in family.samples:
                if sample.labels.get("model") == "toy:2" and sample.name.endswith("_count"):
                    count = sample.value
                if sample.labels.get("model") == "toy:2" and sample.name.endswith("_sum"):
                    total = sample.value
    return count, total


def test_concurrent_http_requests_are_batched_with_identical_results(repository_dir, server_for, tmp_path):
    settings = Settings(artifacts=repository_dir, batching=BatchingConfig(max_batch_size=64, max_queue_delay_ms=20))
    rng = np.random.default_rng(1)
    rows = rng.random((48, 1, 2, 2)).tolist()
    with server_for(settings) as (base_url, _):
        sequential = [
            loopback.post(f"{base_url}/predict", json={"model": "toy", "inputs": [r]}).json() for r in rows[:8]
        ]
        calls_before, rows_before = _batch_metrics(base_url)

        async def concurrent():
            async with httpx.AsyncClient(base_url=base_url) as client:
                return await asyncio.gather(
                    *(client.post("/predict", json={"model": "toy", "inputs": [r]}) for r in rows)
                )

        responses = asyncio.run(concurrent())
        calls_after, rows_after = _batch_metrics(base_url)
    assert all(r.status_code == 200 for r in responses)
    assert rows_after - rows_before == 48
    assert calls_after - calls_before < 48 / 2, "48 concurrent single-row requests should share onnxruntime calls"
    for seq, conc in zip(sequential, responses[:8]):
        assert conc.json()["predictions"][0]["probabilities"] == pytest.approx(
            seq["predictions"][0]["probabilities"], abs=1e-7
        )


def test_http_503_with_retry_after_when_the_queue_is_full(linear_artifact, server_for, tmp_path):
    linear_artifact(tmp_path, "toy", "1")
    # the first request waits 200 ms for its batch to fill, holding the only queue slot meanwhile
    (tmp_path / "toy" / "serving.json").write_text(
        json.dumps({"max_batch_size": 64, "max_queue_delay_ms": 200, "max_queue_rows": 1})
    )
    settings = Settings(artifacts=tmp_path, limits={"retry_after_seconds": 2})
    with server_for(settings) as (base_url, _):

        async def burst():
            async with httpx.AsyncClient(base_url=base_url) as client:
                return await asyncio.gather(
                    *(client.post("/predict", json={"inputs": [[0.1] * 4] * 1}) for _ in range(30))
                )

        responses = asyncio.run(burst())
        models = loopback.get(f"{base_url}/models").json()
    statuses = {r.status_code for r in responses}
    assert statuses <= {200, 503} and 503 in statuses and 200 in statuses
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.headers["retry-after"] == "2" and refused.json()["error"]["code"] == "overloaded"
    assert models["models"][0]["versions"][0]["batching"]["max_queue_rows"] == 1


def test_without_a_queue_delay_a_lone_request_runs_at_once_and_load_still_batches():
    async def scenario():
        model = CountingModel(delay=0.02)
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=64, max_queue_delay_ms=0), "m")
        batcher.start()
        lone = [(await batcher.submit(np.ones((1, 1, 1), np.float32)))[1].queue_seconds for _ in range(5)]
        await _submit_all(batcher, [np.ones((1, 1, 1), np.float32) for _ in range(20)])
        await batcher.stop()
        return lone, model.calls

    lone, calls = asyncio.run(scenario())
    # no waiting for a batch that cannot fill: the median, as one thread hand-off may wait for a saturated core
    assert np.median(lone) < 0.005
    assert calls[:5] == [1] * 5 and len(calls) - 5 < 20 / 2  # the 20 concurrent requests shared calls


def test_a_lone_request_waits_the_configured_queue_delay_and_no_longer():
    """The delay is timed on the inference thread: a busy event loop does not stretch it."""

    async def scenario():
        batcher = DynamicBatcher(CountingModel(), BatchingConfig(max_batch_size=64, max_queue_delay_ms=20), "m")
        batcher.start()
        waits = []
        for _ in range(5):
            _, timing = await batcher.submit(np.ones((1, 1, 1), np.float32))
            waits.append(timing.queue_seconds)
        blocker = asyncio.ensure_future(batcher.submit(np.ones((1, 1, 1), np.float32)))
        await asyncio.sleep(0)
        time.sleep(0.05)  # the event loop is blocked for longer than the delay
        _, blocked_timing = await blocker
        await batcher.stop()
        return waits, blocked_timing

    waits, blocked = asyncio.run(scenario())
    # every request waits the delay; the median bounds what is added (a loaded machine may deschedule one wait)
    assert min(waits) >= 0.019 and sorted(waits)[2] < 0.030, waits
    assert blocked.queue_seconds < 0.030 and blocked.inference_seconds < 0.03


def test_predict_tells_its_queue_and_inference_time(linear_artifact, server_for, tmp_path):
    linear_artifact(tmp_path, "toy", "1")
    (tmp_path / "toy" / "serving.json").write_text(json.dumps({"max_queue_delay_ms": 15}))
    with server_for(Settings(artifacts=tmp_path)) as (base_url, _):
        r = loopback.post(f"{base_url}/predict", json={"inputs": [[0.1] * 4]})
    assert r.status_code == 200
    timing = dict(part.strip().split(";dur=") for part in r.headers["server-timing"].split(","))
    assert set(timing) == {"queue", "infer"}
    assert 14.0 <= float(timing["queue"]) < 40.0 and 0.0 <= float(timing["infer"]) < 100.0


def test_several_sessions_take_batches_from_one_queue():
    async def scenario():
        first, second = CountingModel(delay=0.01), CountingModel(delay=0.01)
        batcher = DynamicBatcher([first, second], BatchingConfig(max_batch_size=4, max_queue_delay_ms=2), "m")
        batcher.start()
        inputs = [np.full((1, 1, 1), i, np.float32) for i in range(40)]
        results = await _submit_all(batcher, inputs)
        await batcher.stop()
        return first, second, inputs, results

    first, second, inputs, results = asyncio.run(scenario())
    assert first.calls and second.calls and sum(first.calls) + sum(second.calls) == 40
    for x, (outputs, _) in zip(inputs, results):
        np.testing.assert_array_equal(outputs["sum"], x.reshape(1, 1))


def test_a_model_is_served_by_the_configured_number_of_sessions(linear_artifact, server_for, tmp_path):
    linear_artifact(tmp_path, "toy", "1")
    (tmp_path / "toy" / "serving.json").write_text(json.dumps({"instances": 3}))
    with server_for(Settings(artifacts=tmp_path)) as (base_url, _):
        health = loopback.get(f"{base_url}/health").json()
        rows = np.random.default_rng(0).random((20, 4)).tolist()

        async def burst():
            async with httpx.AsyncClient(base_url=base_url) as client:
                return await asyncio.gather(*(client.post("/predict", json={"inputs": [r]}) for r in rows))

        responses = asyncio.run(burst())
    assert health["models"][0]["sessions"] == 3
    assert all(r.status_code == 200 for r in responses)


class GatedModel(CountingModel):
    """A model whose every call waits for ``gate`` (a session stuck until the test lets it go)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def __call__(self, x):
        self.gate.wait(30)
        return super().__call__(x)


def test_a_request_past_its_deadline_gets_503_and_no_batch_runs_it_later():
    async def scenario():
        model = GatedModel()
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1, deadline_seconds=0.3, instances=1), "m", 2)
        batcher.start()
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(batcher.submit(np.ones((1, 1), np.float32)) for _ in range(3)), return_exceptions=True
        )
        waited = time.monotonic() - started
        model.gate.set()  # the session comes back: the next request is served, the abandoned ones never run
        after, _ = await batcher.submit(np.full((1, 1), 2.0, np.float32))
        await batcher.stop()
        return outcomes, waited, after, model.calls

    outcomes, waited, after, calls = asyncio.run(scenario())
    assert all(isinstance(o, DeadlineExceeded) for o in outcomes), outcomes
    assert outcomes[0].status == 503 and outcomes[0].headers == {"Retry-After": "2"}
    assert "deadline of 0.3 s" in outcomes[0].message
    assert 0.3 <= waited < 1.5, f"answered {waited:.2f} s after submitting, with a deadline of 0.3 s"
    assert after["sum"].tolist() == [[2.0]]
    assert calls == [1, 1], "the stuck batch, then the next request: the two queued past their deadline never ran"


def test_a_failing_callback_leaves_the_other_replies_of_its_batch_delivered(caplog):
    model = GatedModel()
    batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=8, instances=1), "m")
    batcher.start()
    answers: dict[int, object] = {}
    batcher.submit_nowait(np.zeros((1, 1), np.float32), lambda *a: None)  # the first batch holds the session

    def callback(i: int):
        def done(outputs, timing, exc) -> None:
            if i == 2:
                raise RuntimeError("this reply's socket broke")
            answers[i] = (outputs["sum"].tolist(), timing.batch_rows)

        return done

    time.sleep(0.05)
    for i in range(5):
        batcher.submit_nowait(np.full((1, 1), float(i), np.float32), callback(i))
    with caplog.at_level("ERROR"):
        model.gate.set()
        batcher.close()
        batcher.join()
    assert answers == {i: ([[float(i)]], 5) for i in (0, 1, 3, 4)}, "one batch of 5; every reply but the broken one"
    assert any("could not be delivered" in r.getMessage() for r in caplog.records)


def test_the_window_bounds_the_batches_running_at_once():
    running, most = [0], [0]
    lock = threading.Lock()

    def run(x):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return {"sum": x}

    async def scenario(window: int):
        batcher = DynamicBatcher([run] * 4, BatchingConfig(max_batch_size=1), "m")
        batcher.set_window(window)
        batcher.start()
        await asyncio.gather(*(batcher.submit(np.ones((1, 1), np.float32)) for _ in range(12)))
        await batcher.stop()

    asyncio.run(scenario(1))
    assert most[0] == 1
    most[0] = 0
    asyncio.run(scenario(4))
    assert most[0] > 1, "a wider window lets the other inference threads run"


def test_an_empty_queue_takes_a_request_larger_than_the_bound():
    async def scenario():
        batcher = DynamicBatcher(CountingModel(), BatchingConfig(max_batch_size=4, max_queue_rows=2), "m")
        batcher.start()
        outputs, _ = await batcher.submit(np.ones((3, 1), np.float32))
        await batcher.stop()
        return outputs

    assert asyncio.run(scenario())["sum"].shape == (3, 1)
