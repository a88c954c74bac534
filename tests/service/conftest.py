"""Fixtures for the service tests: small ONNX artifacts built with the onnx helper API (no torch)
and real uvicorn servers on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import sqlalchemy as sa
import uvicorn
from onnx import TensorProto, helper, numpy_helper

from bench.common import loopback
from calibkit.conformal import SplitConformal
from calibkit.manifest import (
    CalibrationSpec,
    ConformalSpec,
    InputSpec,
    Manifest,
    Preprocessing,
    ReferenceDistribution,
    load_manifest,
    write_manifest,
)
from service.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ARTIFACT = ROOT / "artifacts" / "digits-lenet5" / "1"


def build_linear_onnx(path: Path, weights: np.ndarray, bias: np.ndarray, temperature: float, shape=(1, 2, 2)) -> None:
    """A linear classifier logits = flatten(x) @ W + b with probabilities = softmax(logits / T)."""
    features = int(np.prod(shape))
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["input", "flat_shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logits"]),
            helper.make_node("Div", ["logits", "T"], ["scaled"]),
            helper.make_node("Softmax", ["scaled"], ["probabilities"], axis=1),
        ],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *shape])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", weights.shape[1]]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", weights.shape[1]]),
        ],
        [
            numpy_helper.from_array(np.array([-1, features], dtype=np.int64), "flat_shape"),
            numpy_helper.from_array(weights.astype(np.float32), "W"),
            numpy_helper.from_array(bias.astype(np.float32), "b"),
            numpy_helper.from_array(np.array(temperature, dtype=np.float32), "T"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_linear_artifact(
    root: Path,
    name: str = "toy",
    version: str = "1",
    classes=("a", "b", "c"),
    temperature: float = 2.0,
    seed: int = 0,
    shape: tuple[int, ...] = (1, 2, 2),
) -> Path:
    """A complete artifact ``root/name/version`` around ``build_linear_onnx``: images of ``shape`` (C, H, W), or
    feature vectors (F,) without preprocessing."""
    directory = root / name / version
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    features = int(np.prod(shape))
    build_linear_onnx(
        directory / "model.onnx",
        rng.normal(0, 3, (features, len(classes))),
        rng.normal(0, 1, len(classes)),
        temperature,
        shape,
    )
    manifest = Manifest(
        name=name,
        version=version,
        created_at="2026-11-22T00:00:00+00:00",
        model_sha256=hashlib.sha256((directory / "model.onnx").read_bytes()).hexdigest(),
        class_names=list(classes),
        input=InputSpec(name="input", shape=[None, *shape]),
        outputs={"logits": "logits", "probabilities": "probabilities"},
        preprocessing=Preprocessing(color_mode="L", image_size=shape[-1]) if len(shape) == 3 else None,
        calibration=CalibrationSpec(
            method="temperature", params={"temperature": temperature}, n_samples=100, in_graph=True
        ),
        reference=ReferenceDistribution(confidences=[0.5, 0.7, 0.9], accuracy=0.7, ece=0.05),
    )
    write_manifest(manifest, directory)
    return directory


def write_conformal(
    directory, seed: int = 0, default_method: str = "aps", default_coverage: float = 0.8, floors: bool = True
) -> dict:
    """Give a five-class artifact LAC, randomized APS and randomized RAPS calibrators and (``floors``) the floor
    sets' fitted on calibrated Dirichlet probabilities (labels drawn from them), as ``conformal.json`` checksummed
    in its manifest; the calibrators by method, the floor ones under ``"floor"``."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(5, 0.6), size=400)
    labels = np.array([rng.choice(5, p=p) for p in probs])
    calibrators = {
        "lac": SplitConformal.fit(probs, labels, "lac"),
        "aps": SplitConformal.fit(probs, labels, "aps", u=rng),
        "raps": SplitConformal.fit(probs, labels, "raps", k_reg=1, lam=0.05, u=rng),
    }
    floor = {
        "lac": SplitConformal.fit(probs, labels, "lac", floor=True),
        "aps": SplitConformal.fit(probs, labels, "aps", floor=True),
        "raps": SplitConformal.fit(probs, labels, "raps", k_reg=1, lam=0.05, floor=True),
    }
    data = {
        "format": 1,
        "calibrators": {m: c.to_dict() for m, c in calibrators.items()},
        "split": {"fitted_on": "validation", "rows": 400, "seed": seed, "fraction": 0.5},
    }
    if floors:
        data["floor_calibrators"] = {m: c.to_dict() for m, c in floor.items()}
    raw = json.dumps(data).encode()
    (directory / "conformal.json").write_bytes(raw)
    spec = ConformalSpec(
        sha256=hashlib.sha256(raw).hexdigest(),
        methods=sorted(calibrators),
        default_method=default_method,
        default_coverage=default_coverage,
        calibration_rows=400,
    )
    write_manifest(load_manifest(directory / "manifest.json").model_copy(update={"conformal": spec}), directory)
    return calibrators | {"floor": floor if floors else {m: replace(c, floor=True) for m, c in calibrators.items()}}


def flush_prediction_log(app) -> None:
    """Write the prediction log's queue now, on the server's event loop (it is written in the background)."""
    asyncio.run_coroutine_threadsafe(app.state.parts.prediction_log.flush(), app.state.parts.feedback.loop).result(30)


@contextmanager
def running_server(settings: Settings):
    """A real uvicorn server for ``settings`` on a free loopback port; yields its base URL."""
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="session")
def repository_dir(tmp_path_factory) -> Path:
    """The committed default artifact plus a toy model with two versions."""
    root = tmp_path_factory.mktemp("artifacts")
    shutil.copytree(DEFAULT_ARTIFACT, root / "digits-lenet5" / "1")
    write_linear_artifact(root, "toy", "1", temperature=2.0, seed=1)
    write_linear_artifact(root, "toy", "2", temperature=1.5, seed=2)
    return root


@pytest.fixture(scope="session")
def server(repository_dir):
    """(base_url, app) of a server over ``repository_dir`` with the default model digits-lenet5."""
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        limits={"max_rows_per_request": 64, "max_body_bytes": 256 * 1024},
        store={"url": f"sqlite:///{repository_dir.parent / 'shared.db'}"},
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server[0]


@pytest.fixture(scope="session")
def linear_artifact():
    """``write_linear_artifact(root, name, version, classes, temperature, seed)``."""
    return write_linear_artifact


def binary_probabilities(base_url: str, model: str, shape, rows: int = 3, seed: int = 0) -> np.ndarray:
    """The probabilities the service answers over REST for ``rows`` seeded rows of ``shape`` (tritonclient.http,
    binary tensors both ways: the float32 bytes themselves), to compare other clients' answers with, bit for bit."""
    import tritonclient.http as triton

    x = np.random.default_rng(seed).random((rows, *shape), dtype=np.float32)
    client = triton.InferenceServerClient(base_url.removeprefix("http://"))
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("probabilities", binary_data=True)])
    return result.as_numpy("probabilities")


def assert_ids_take_feedback(base_url: str, ids: list[str], timeout: float = 10.0) -> None:
    """Feedback on every id is accepted; ids the prediction log has not written yet (it writes behind the
    answer) are sent again until ``timeout``."""
    items = [{"prediction_id": i, "label": 0} for i in ids]
    deadline = time.monotonic() + timeout
    while items:
        answer = loopback.post(f"{base_url}/feedback", json={"items": items}).json()
        assert all("unknown prediction id" in r["reason"] for r in answer["rejected"]), answer
        items = [items[r["index"]] for r in answer["rejected"]]
        assert time.monotonic() < deadline, f"feedback on {items} not accepted"
        time.sleep(0.05 if items else 0)


@pytest.fixture(scope="session")
def rest_probabilities():
    """``binary_probabilities(base_url, model, shape, rows, seed)``."""
    return binary_probabilities


@pytest.fixture(scope="session")
def ids_take_feedback():
    """``assert_ids_take_feedback(base_url, ids)``."""
    return assert_ids_take_feedback


@pytest.fixture(scope="session")
def server_for():
    """``running_server(settings)`` as a context manager yielding (base_url, app)."""
    return running_server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def database_url(request, tmp_path, postgres) -> str:
    """Each monitoring test runs on an SQLite file and on the real PostgreSQL."""
    return f"sqlite:///{tmp_path / 'monitoring.db'}" if request.param == "sqlite" else postgres()


@pytest.fixture
def webhook():
    """A webhook receiver on loopback: ``.url`` to configure, ``.received`` the JSON bodies POSTed to it."""
    received: list = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}/", received=received)
    server.shutdown()


@pytest.fixture
def evaluate_now():
    """``evaluate_now(app)``: one alarm evaluation pass of a ``running_server`` app now, from the test's
    thread (the evaluator runs on the server's event loop); returns the transitions."""

    def run(app, timeout: float = 120.0) -> list[dict]:
        evaluator = app.state.parts.evaluator
        return asyncio.run_coroutine_threadsafe(evaluator.run_once(), evaluator.loop).result(timeout)

    return run


class CuttableProxy:
    """A TCP forwarder to PostgreSQL whose link can be cut and restored, to simulate an outage; ``database_url``:
    the server's URL through the proxy."""

    def __init__(self, database_url: str):
        parsed = sa.make_url(database_url)
        self.target = (parsed.host or "127.0.0.1", parsed.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.database_url = parsed.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)
        self.up = True
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self):
        self.up = False
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sockets.clear()

    def restore(self):
        self.up = True

    def close(self):
        self.cut()
        self.listener.close()


@pytest.fixture
def cuttable_proxy(pg_url):
    """A ``CuttableProxy`` to the suite's PostgreSQL (emptied, as ``pg_url``), closed after the test."""
    proxy = CuttableProxy(pg_url)
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def add_conformal():
    """``write_conformal(directory, ...)``: conformal calibrators for a five-class linear artifact."""
    return write_conformal
