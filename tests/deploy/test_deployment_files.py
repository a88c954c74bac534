"""The deployment files checked with the real tools: hadolint, docker-compose, promtool; and the
Grafana dashboard, alert rules and compose environment checked against what the service exports."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.metrics import ServiceMetrics
from service.settings import setting_path
from service.settings_env import RENAMED, replacement

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is not installed: run `make tools` (scripts/install-tools.sh)"
    return found


@pytest.mark.e2e  # needs hadolint
def test_dockerfile_passes_hadolint():
    result = subprocess.run([_tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout


@pytest.mark.e2e  # needs docker-compose
def test_compose_file_is_accepted_by_docker_compose():
    result = subprocess.run(
        [_tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert {"service", "service-gpu", "postgres", "prometheus", "grafana"} <= set(config["services"])
    gpu = config["services"]["service-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert "pgdata" in config["volumes"]


@pytest.mark.e2e  # needs promtool
def test_alert_rules_check_and_unit_tests_pass():
    check = subprocess.run(
        [_tool("promtool"), "check", "rules", str(PROMETHEUS / "alerts.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0 and "SUCCESS: 13 rules found" in check.stdout, check.stdout + check.stderr
    tests = subprocess.run(
        [_tool("promtool"), "test", "rules", "alerts_test.yml"], capture_output=True, text=True, cwd=PROMETHEUS
    )
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


@pytest.mark.e2e  # needs promtool
def test_prometheus_config_is_valid(tmp_path):
    config = (
        (PROMETHEUS / "prometheus.yml")
        .read_text()
        .replace("/etc/prometheus/alerts.yml", str(PROMETHEUS / "alerts.yml"))
    )
    (tmp_path / "prometheus.yml").write_text(config)
    result = subprocess.run(
        [_tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _exported_series() -> set[str]:
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {family.name + s for family in ServiceMetrics().registry.collect() for s in suffixes[family.type]}


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(calib[_:][a-z0-9_:]+)", expr))


def test_dashboard_and_alerts_only_use_metrics_the_service_exports():
    recorded = {
        r["record"]
        for g in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    known = _exported_series() | recorded
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "calibration.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "request rate",
        "latency",
        "batch",
        "rolling ece",
        "alarm state",
        "reliability",
        "set coverage",
        "set size",
    ):
        assert topic in titles
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= _metric_names(target["expr"])
    for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            used |= _metric_names(rule["expr"])
    assert used and used <= known, used - known


def _names_a_setting(name: str) -> bool:
    """Whether an environment variable name sets a field of ``Settings`` by its current name (``CALIB_<FIELD>``,
    ``CALIB_<GROUP>__<FIELD>``); an old name, still accepted with a warning, does not."""
    return setting_path(name) is not None


def test_the_shipped_files_name_settings_by_their_current_names():
    shipped = [ROOT / "Dockerfile", ROOT / "docker-compose.yml", *sorted((ROOT / "deploy").rglob("*"))]
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in shipped
        if path.is_file() and path.suffix in ("", ".yml", ".yaml", ".json")
        for name in re.findall(r"\bCALIB_[A-Z0-9_]+", path.read_text())
    }
    assert len(found) > 20
    old = {
        f"{path}: {name} (use {replacement(name.removeprefix('CALIB_').lower())})"
        for path, name in found
        if name.removeprefix("CALIB_").lower() in RENAMED
    }
    assert not old, "old setting names in the shipped files"
    assert [f"{path}: {name}" for path, name in sorted(found) if not _names_a_setting(name)] == []


@pytest.mark.parametrize("service", ["service", "service-gpu"])
def test_compose_environment_names_real_settings(service):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in compose["services"][service]["environment"]:
        assert _names_a_setting(name), name
    # both protocols' ports published, as the image exposes them
    spec = compose["services"][service]
    environment = spec["environment"]
    assert spec["ports"] == [environment["CALIB_PORT"], environment["CALIB_GRPC_PORT"]] == ["8000", "8081"]


def test_settings_reference_names_real_settings():
    current = (ROOT / "docs" / "settings.md").read_text().split("## Deprecated names")[0]
    documented = re.findall(r"^\| `(CALIB_[A-Z0-9_]+)`", current, re.M)
    assert len(documented) > 60 and [name for name in documented if setting_path(name) is None] == []
