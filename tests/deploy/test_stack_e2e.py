"""End-to-end: the stack as docker-compose runs it, checked through /calibration and Prometheus.

Parameterised by URLs: with ``E2E_BASE_URLS`` (comma-separated replica URLs) and
``E2E_PROMETHEUS_URL`` it runs against a stack started with ``docker-compose up``. Without them
(CI here, where there is no Docker engine) it starts the same thing from the compose file itself:
two replicas with the service's ``command`` and ``environment`` from docker-compose.yml -- only the
host, ports, artifact path and the database host are replaced by local ones -- sharing the local
PostgreSQL, and a real Prometheus scraping both with deploy/prometheus/alerts.yml.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from bench.common import loopback
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.ports import free_port
from tests.waiting import answers, wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _interpolated(value) -> str:
    """A compose environment value as docker-compose passes it: ``${NAME:-default}`` from the environment."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1], m[2]), str(value))


ENVIRONMENT = {k: _interpolated(v) for k, v in COMPOSE["services"]["service"]["environment"].items()}
PREDICT, FEEDBACK = (
    {"Authorization": f"Bearer {ENVIRONMENT[name].split(',')[0].split(':', 1)[1]}"}
    for name in ("CALIB_AUTH__PREDICT_TOKENS", "CALIB_AUTH__FEEDBACK_TOKENS")
)
pytestmark = pytest.mark.e2e  # PostgreSQL, Prometheus and two server processes


@pytest.fixture(scope="module")
def stack(postgres):
    if os.environ.get("E2E_BASE_URLS"):
        yield os.environ["E2E_BASE_URLS"].split(","), os.environ["E2E_PROMETHEUS_URL"]
        return
    spec = COMPOSE["services"]["service"]
    processes, urls, workdir = [], [], Path(tempfile.mkdtemp(prefix="calib-e2e-"))
    database = postgres()
    try:
        for _ in range(2):
            port = free_port()
            env = dict(os.environ, **ENVIRONMENT)
            env.update(
                CALIB_HOST="127.0.0.1",
                CALIB_PORT=str(port),
                CALIB_GRPC_PORT="0",
                CALIB_ARTIFACTS=str(ROOT / "artifacts"),
                CALIB_STORE__URL=database,
                CALIB_MONITORING__REFRESH_SECONDS="1",
            )
            assert spec["command"][0] == "python"
            processes.append(
                subprocess.Popen(
                    [sys.executable, *spec["command"][1:]],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(lambda url=url: answers(f"{url}/v2/health/ready"), 40, f"{url} starting", every=0.2)
        prometheus_port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
            "scrape_configs": [
                {
                    "job_name": "calibrated-serving",
                    "static_configs": [{"targets": [u.removeprefix("http://") for u in urls]}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        processes.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        prometheus = f"http://127.0.0.1:{prometheus_port}"
        wait_for(lambda: answers(f"{prometheus}/-/ready"), 40, "prometheus starting", every=0.2)
        yield urls, prometheus
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def _query(prometheus: str, expr: str) -> list:
    return loopback.get(f"{prometheus}/api/v1/query", params={"query": expr}).json()["data"]["result"]


def test_shifted_traffic_raises_the_alarm_in_the_service_and_in_prometheus(stack):
    urls, prometheus = stack
    a, b = urls[0], urls[-1]
    wait_for(
        lambda: len(_query(prometheus, 'up{job="calibrated-serving"} == 1')) == len(urls),
        30,
        "prometheus scraping every replica",
        every=0.5,
    )
    from training.data import load_digits_splits

    test = load_digits_splits().test
    assert loopback.post(f"{a}/predict", json={"inputs": test.x[:1].tolist()}).status_code == 401  # tokens are on
    served = loopback.post(f"{a}/predict", json={"inputs": test.x[:50].tolist()}, headers=PREDICT).json()
    # The latest version answers; `make run` adds versions to artifacts/, so every check below names
    # the version this test drives instead of taking whichever series comes first.
    version = served["version"]
    selector = f'model="digits-lenet5",version="{version}"'
    time.sleep(1.5)  # the replica that served the predictions writes its log every 0.5 s
    items = [{"prediction_id": p["id"], "label": int(t)} for p, t in zip(served["predictions"], test.y[:50])]
    answer = loopback.post(f"{b}/feedback", json={"items": items}, headers=FEEDBACK)
    assert answer.status_code == 200 and answer.json()["accepted"] == 50, answer.text

    z, y = calibrated_logits(1200, n_classes=10, logit_scale=8.0, seed=42)
    for k, start in enumerate(range(0, 1200, 100)):
        scale = 1.0 if start < 400 else 2.5
        items = [
            {"probabilities": p.tolist(), "label": int(t), "model": "digits-lenet5", "version": version}
            for p, t in zip(softmax(scale * z[start : start + 100]), y[start : start + 100])
        ]
        assert (
            loopback.post(f"{urls[k % len(urls)]}/feedback", json={"items": items}, headers=FEEDBACK).status_code == 200
        )

    def every_report_alarmed():  # the replicas evaluate the alarm every second, not in the request
        reports = [
            loopback.get(f"{u}/calibration", params={"model": "digits-lenet5", "version": version}).json() for u in urls
        ]
        return reports if all(r["alarm"]["state"] == "alarm" for r in reports) else None

    reports = wait_for(every_report_alarmed, 30, "every replica's report alarmed", every=0.5)
    assert {r["version"] for r in reports} == {version}
    assert len({r["ece"] for r in reports}) == 1 and reports[0]["ece"] > 0.05

    def every_replica_alarmed():
        alarmed = _query(prometheus, f"calib_alarm_state{{{selector}}} == 2")
        return alarmed if len(alarmed) == len(urls) else None

    state = wait_for(every_replica_alarmed, 30, "every replica's alarm metric", every=0.5)
    assert {s["metric"]["instance"] for s in state} == {u.removeprefix("http://") for u in urls}
    alert = wait_for(
        lambda: _query(prometheus, f'ALERTS{{alertname="ModelMiscalibrated",{selector}}}'), 30, "the alert", every=0.5
    )
    assert alert[0]["metric"]["alertstate"] in {"pending", "firing"}

    # The bin counters exist from start-up (at 0, so increase() misses no label): the rule reads NaN
    # (0/0) until the labels' counts are scraped, then the shifted traffic's ECE once every replica's are.
    def rule_sees_the_shift():
        ece = _query(prometheus, f"calib:ece_from_bins:1h{{{selector}}}")
        return ece if ece and float(ece[0]["value"][1]) > 0.05 else None

    assert (
        float(wait_for(rule_sees_the_shift, 30, "the recording rule seeing the shift", every=0.5)[0]["value"][1]) > 0.05
    )
