"""The Kubernetes manifests tied to the real process, on loopback against the real PostgreSQL.

A service process is started exactly as deploy/k8s/base's Deployment (and KServe's InferenceService) says:
the container's command, the image's environment (Dockerfile ENV: the ``dockerfile`` fixture), the ConfigMap's
values and the container's env, with the Secret's keys filled from test values. Only what a pod has and this
machine has not is replaced: the listen address (loopback), the ports (free ones), the artifacts path (the
repository's, baked into the image at /app/artifacts) and the writable /tmp. Then every probe passes as the
kubelet runs it (HTTP 200, or SERVING from grpc.health.v1 for a gRPC probe),
/predict and /feedback work, and SIGTERM drains within the grace period with every acknowledged label stored.

Eight replicas started at once against an empty store, and against a store one schema version old, migrate
it exactly once (one log line among all of them, block sums built once), all come up serving, and none
logs a store failure: the migration's advisory lock makes the others wait until the schema is ready.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import sqlalchemy as sa
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import loopback
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.ports import free_port
from service.store import Store, legacy
from service.store.schema import calibration_keys, label_bins, labels, prediction_log, schema_info, served_choices
from tests.service.store.v2_store import insert_version_2

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s" / "base"
pytestmark = pytest.mark.e2e  # PostgreSQL and service processes
REPLICAS = 8
# the Secret's keys but database-url, which is the test database
SECRET = {
    "admin-tokens": "admin:k8s-test-token",
    "predict-tokens": "app:k8s-predict-token",
    "feedback-tokens": "labeller:k8s-feedback-token",
}
PREDICT = {"Authorization": "Bearer k8s-predict-token"}
FEEDBACK = {"Authorization": "Bearer k8s-feedback-token"}


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _deployment_container() -> dict:
    (deployment,) = _docs(BASE / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _inference_service_container() -> dict:
    (service,) = _docs(ROOT / "deploy" / "kserve" / "inferenceservice.yaml")
    (container,) = service["spec"]["predictor"]["containers"]
    return container


def _pod_env(
    container: dict, image_env: dict[str, str], secret: dict[str, str], port: int, grpc_port: int, tmp: Path
) -> dict[str, str]:
    """The container's environment as Kubernetes assembles it: image ENV, then envFrom (the ConfigMap), then env
    (literal values and Secret keys); then the replacements of the module docstring."""
    (config,) = _docs(BASE / "configmap.yaml")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), **image_env}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"] == config["metadata"]["name"]
        env.update(config["data"])
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "calibrated-serving"
            env[variable["name"]] = secret[ref["key"]]
    assert env["CALIB_PORT"] == "8000" and env["CALIB_HOST"] == "0.0.0.0" and env["CALIB_ARTIFACTS"] == "/app/artifacts"
    assert env["CALIB_GRPC_PORT"] == "8081"
    (tmp / "matplotlib").mkdir(parents=True, exist_ok=True)
    env.update(
        CALIB_HOST="127.0.0.1",
        CALIB_PORT=str(port),
        CALIB_GRPC_PORT=str(grpc_port),
        CALIB_ARTIFACTS=str(ROOT / "artifacts"),
        MPLCONFIGDIR=str(tmp / "matplotlib"),
    )
    return env


def _start(
    container: dict, image_env: dict[str, str], secret: dict[str, str], tmp: Path, log: Path
) -> tuple[subprocess.Popen, str, str]:
    """A process started with the container's command and environment (over the image's ``image_env``);
    (process, base URL, gRPC target)."""
    port, grpc_port = free_port(), free_port()
    command = container["command"]
    assert command[0] == "python" and "args" not in container
    with log.open("w") as out:
        env = _pod_env(container, image_env, secret, port, grpc_port, tmp)
        process = subprocess.Popen(
            [sys.executable, *command[1:]], env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT
        )
    return process, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def _probe(url: str, grpc_target: str, container: dict, kind: str) -> bool:
    """One run of a container's probe as the kubelet runs it: an HTTP GET answered 200, or a grpc.health.v1 Check
    of the probe's service answered SERVING (on the probe's port, which must be the container's gRPC port)."""
    probe = container[kind]
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "httpGet" in probe:
            return loopback.get(url + probe["httpGet"]["path"], timeout=timeout).status_code == 200
        assert probe["grpc"]["port"] in {p["containerPort"] for p in container["ports"] if p["name"] in ("grpc", "h2c")}
        with grpc.insecure_channel(grpc_target) as channel:
            request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
            answer = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
        return answer.status == health_pb2.HealthCheckResponse.SERVING
    except (httpx.TransportError, grpc.RpcError):
        return False


def _wait_started(process: subprocess.Popen, url: str, grpc_target: str, container: dict, log: Path) -> None:
    """Poll the startup probe the way the kubelet does: every periodSeconds, at most failureThreshold times."""
    probe = container["startupProbe"]
    for _ in range(probe["failureThreshold"]):
        assert process.poll() is None, f"the process exited with {process.returncode}:\n{log.read_text()}"
        if _probe(url, grpc_target, container, "startupProbe"):
            return
        time.sleep(min(probe["periodSeconds"], 0.25))
    raise AssertionError(f"{url} failed its startup probe:\n{log.read_text()}")


def _predict_and_label(url: str, n: int = 20) -> int:
    """Predictions through /predict and their labels through /feedback (retried while the prediction log has
    not yet written them); the labels accepted."""
    from training.data import load_digits_splits

    test = load_digits_splits().test
    assert loopback.post(f"{url}/predict", json={"inputs": test.x[:1].tolist()}, timeout=30).status_code == 401
    served = loopback.post(f"{url}/predict", json={"inputs": test.x[:n].tolist()}, headers=PREDICT, timeout=30)
    assert served.status_code == 200, served.text
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(served.json()["predictions"], test.y[:n])]
    deadline = time.monotonic() + 20
    while True:
        answer = loopback.post(f"{url}/feedback", json={"items": items}, headers=FEEDBACK, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if body["accepted"] == n or time.monotonic() > deadline:
            return body["accepted"]
        time.sleep(0.25)


def _count(url: str, table) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(sa.select(sa.func.count()).select_from(table)).scalar()
    finally:
        engine.dispose()


@pytest.mark.parametrize("manifest", ["deployment", "inferenceservice"])
def test_the_service_runs_as_its_manifest_says(manifest, dockerfile, pg_url, tmp_path):
    container = _deployment_container() if manifest == "deployment" else _inference_service_container()
    (deployment,) = _docs(BASE / "deployment.yaml")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    log = tmp_path / "service.log"
    process, url, grpc_target = _start(container, dockerfile["env"], {**SECRET, "database-url": pg_url}, tmp_path, log)
    try:
        _wait_started(process, url, grpc_target, container, log)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert _probe(url, grpc_target, container, kind), kind
        assert _predict_and_label(url) == 20
        health = loopback.get(f"{url}/health", headers={"Authorization": "Bearer k8s-test-token"}).json()
        assert health["ready"] and health["status"] == "ok"
        process.send_signal(signal.SIGTERM)  # what the kubelet sends after preStop
        # uvicorn drains and runs the shutdown (prediction log and feedback writer flushed); the exit is clean
        assert process.wait(timeout=grace) == 0, log.read_text()
        assert "stopped: queued and in-flight batches finished" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    assert _count(pg_url, labels) == 20
    assert "Traceback" not in log.read_text() and " ERROR " not in log.read_text()


def _make_version_1_store(pg_url: str, image_env: dict[str, str], tmp_path: Path) -> int:
    """A store left behind by a version-1 service: labels without block sums or served probabilities. Returns its
    label count."""
    container = _deployment_container()
    log = tmp_path / "seed.log"
    process, url, grpc_target = _start(container, image_env, {**SECRET, "database-url": pg_url}, tmp_path, log)
    try:
        _wait_started(process, url, grpc_target, container, log)
        z, y = calibrated_logits(300, n_classes=10, seed=3)
        items = [
            {"probabilities": p.tolist(), "label": int(t), "model": "digits-lenet5"} for p, t in zip(softmax(z), y)
        ]
        assert (
            loopback.post(f"{url}/feedback", json={"items": items}, headers=FEEDBACK, timeout=30).json()["accepted"]
            == 300
        )
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    engine, store = sa.create_engine(pg_url), Store(pg_url)
    with engine.connect() as c:
        logged = store.predictions.fetch(c.execute(sa.select(labels.c.prediction_id)).scalars().all())
    store.db.engine.dispose()
    with engine.begin() as c:  # the log as versions 1 and 2 kept it, and no table of version 3
        legacy.predictions.create(c)
        insert_version_2(c, list(logged.values()))
        for table in (prediction_log, calibration_keys, served_choices):
            table.drop(c)
        for table, column in (
            ("labels", "prediction_id"),
            ("pending_labels", "prediction_id"),
            ("shift_state", "cursor_id"),
        ):
            c.exec_driver_sql(  # ids as text, as versions 1 and 2 kept them
                f"ALTER TABLE {table} ALTER COLUMN {column} TYPE varchar(32) USING replace({column}::text, '-', '')"
            )
        c.execute(label_bins.delete())
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN probabilities")
        c.exec_driver_sql("ALTER TABLE labels DROP COLUMN logits")
        c.execute(schema_info.update().values(version=1))
    engine.dispose()
    return 300


@pytest.mark.parametrize("store", ["empty", "version 1"])
def test_replicas_starting_together_migrate_the_store_once_and_all_serve(store, dockerfile, pg_url, tmp_path):
    seeded = _make_version_1_store(pg_url, dockerfile["env"], tmp_path) if store == "version 1" else 0
    container = _deployment_container()
    started = []
    try:
        for k in range(REPLICAS):  # all at once: none waits for another to be up
            log = tmp_path / f"replica-{k}.log"
            secret = {**SECRET, "database-url": pg_url}
            started.append((*_start(container, dockerfile["env"], secret, tmp_path / f"r{k}", log), log))
        for process, url, grpc_target, log in started:
            _wait_started(process, url, grpc_target, container, log)
            assert _probe(url, grpc_target, container, "readinessProbe")
        for process, url, _, log in started:
            assert process.poll() is None, log.read_text()
            assert _predict_and_label(url, n=5) == 5
    finally:
        for process, *_ in started:
            process.send_signal(signal.SIGTERM)
        for process, *_ in started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    logs = [log.read_text() for *_, log in started]
    migrated = "schema migrated from version 1" if seeded else "schema created at version"
    assert sum(text.count(migrated) for text in logs) == 1, "\n".join(logs)
    assert not any("database unavailable" in text or "Traceback" in text for text in logs), "\n".join(logs)
    engine = sa.create_engine(pg_url)
    with engine.connect() as c:
        assert c.execute(sa.select(schema_info.c.version)).scalars().all() == [3]
        assert c.execute(sa.select(sa.func.count()).select_from(labels)).scalar() == seeded + 5 * REPLICAS
        counted = c.execute(sa.select(sa.func.coalesce(sa.func.sum(label_bins.c.count), 0))).scalar()
    engine.dispose()
    assert counted == seeded + 5 * REPLICAS  # the block sums hold every label once: built once, then added to
