"""The Kubernetes manifests validated offline: every rendered kustomization (base, CPU and GPU overlays,
prometheus-operator) with ``kubernetes-validate --strict`` against current Kubernetes versions, the KServe
InferenceService against KServe's own CRD schema with unknown fields rejected, a broken copy of each failing,
and the manifests checked against the Dockerfile, the settings and each other so that none drifts."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml

from service.app import create_app
from service.serving.grpc_server import SERVICE
from service.settings import Settings, setting_path

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KSERVE = ROOT / "deploy" / "kserve"
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu", "prometheus-operator"]
KUBERNETES_VERSIONS = ["1.33.0", "1.37.0"]  # the oldest still supported and the newest the validator bundles
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # prometheus-operator's CRDs: checked by their own tests below


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _merge(base, patch):
    """Kustomize's strategic merge for the fields these patches touch: maps merge, lists of named items
    (containers, env, volumes) merge by name, other lists and scalars are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        out = {item["name"]: item for item in base}
        for item in patch:
            out[item["name"]] = _merge(out[item["name"]], item) if item["name"] in out else item
        return list(out.values())
    return patch


def _render(directory: Path) -> list[dict]:
    """The resources a kustomization renders to (the subset of Kustomize these files use: resources, labels
    without selectors, image tags and strategic-merge patches)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = []
    for resource in spec.get("resources", []):
        path = directory / resource
        docs += _render(path) if path.is_dir() else _load(path)
    for patch_ref in spec.get("patches", []):
        patch = yaml.safe_load((directory / patch_ref["path"]).read_text())
        matches = [
            i
            for i, d in enumerate(docs)
            if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])
        ]
        assert len(matches) == 1, f"{patch_ref['path']} patches no resource of {directory}"
        docs[matches[0]] = _merge(docs[matches[0]], patch)
    for label in spec.get("labels", []):
        assert not label.get("includeSelectors")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in spec.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "InferenceService":
        return spec["predictor"]["containers"]
    return spec.get("template", {}).get("spec", {}).get("containers", [])


def _validate(docs: list[dict], tmp_path: Path, version: str) -> subprocess.CompletedProcess:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    tool = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert tool, "kubernetes-validate is not installed: pip install -e '.[dev]'"
    return subprocess.run([tool, "--strict", "-k", version, str(path)], capture_output=True, text=True)


def _by_kind(docs: list[dict]) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in docs}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_manifest_validates_strictly(kustomization, version, tmp_path):
    docs = _render(K8S / kustomization)
    result = _validate(docs, tmp_path, version)
    assert result.returncode == 0 and "ERROR" not in result.stdout, result.stdout + result.stderr
    core = [d for d in docs if d["kind"] not in OPERATOR_KINDS]
    passed = re.findall(r"passed for resource (\S+)/", result.stdout)
    assert sorted(passed) == sorted(d["kind"].lower() for d in core), result.stdout


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_kustomize_subset_renders_what_kubectl_renders(kustomization):
    """Where kubectl is installed, its Kustomize renders exactly what the validation above validated."""
    kubectl = shutil.which("kubectl")
    ours = sorted(_render(K8S / kustomization), key=lambda d: (d["kind"], d["metadata"]["name"]))
    if kubectl:
        rendered = subprocess.run(
            [kubectl, "kustomize", str(K8S / kustomization)], capture_output=True, text=True, check=True
        ).stdout
        theirs = sorted(yaml.safe_load_all(rendered), key=lambda d: (d["kind"], d["metadata"]["name"]))
        assert ours == theirs
    assert {d["kind"] for d in ours} >= (
        {"ServiceMonitor", "PrometheusRule"}
        if "operator" in kustomization
        else {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"}
    )


BROKEN = [
    (
        "misspelled field",
        lambda d: d["spec"]["template"]["spec"].__setitem__(
            "contianers", d["spec"]["template"]["spec"].pop("containers")
        ),
    ),
    ("wrong type", lambda d: d["spec"].__setitem__("replicas", "two")),
    (
        "unknown probe field",
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"].__setitem__(
            "httpGett", {"path": "/v2/health/ready", "port": 8000}
        ),
    ),
]


@pytest.mark.parametrize("what, damage", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_deployment_fails_validation(what, damage, tmp_path):
    docs = _render(K8S / "base")
    deployment = _by_kind(docs)["Deployment"]
    damage(deployment)
    result = _validate(docs, tmp_path, KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0 and "ERROR" in result.stdout, result.stdout


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p["spec"]["ingress"][0].__setitem__("form", p["spec"]["ingress"][0].pop("from")),
        lambda p: p["spec"]["ingress"][1]["ports"][0].__setitem__("protocol", ["TCP"]),
    ],
    ids=["misspelled from", "wrong type"],
)
def test_a_broken_network_policy_fails_validation(damage, tmp_path):
    docs = _render(K8S / "base")
    damage(_by_kind(docs)["NetworkPolicy"])
    result = _validate(docs, tmp_path, KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0 and "ERROR" in result.stdout, result.stdout


def _closed(schema):
    """The CRD's schema with unknown fields rejected: every object schema that lists its properties and does not
    preserve unknown fields gets additionalProperties: false (the API server would prune them silently)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def inference_service_schema() -> dict:
    crd = yaml.safe_load((KSERVE / "crd" / "serving.kserve.io_inferenceservices.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == "InferenceService"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return _closed(version["schema"]["openAPIV3Schema"])


def _inference_service() -> dict:
    (doc,) = _load(KSERVE / "inferenceservice.yaml")
    return doc


def test_the_inference_service_validates_against_kserves_crd(inference_service_schema):
    doc = _inference_service()
    assert doc["apiVersion"] == "serving.kserve.io/v1beta1" and doc["kind"] == "InferenceService"
    jsonschema.Draft7Validator(inference_service_schema).validate(doc)
    annotations = doc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert annotations["serving.kserve.io/autoscalerClass"] == "hpa"
    (container,) = _containers(doc)
    assert container["name"] == "kserve-container"  # the container KServe configures
    assert {"name": "PROTOCOL", "value": "v2"} in container["env"]  # KServe's key for a custom predictor's protocol
    # REST and the gRPC port, which KServe knows by the name h2c (HTTP/2 cleartext)
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8000), ("h2c", 8081)]


BROKEN_SERVICE = [
    (
        "misspelled field",
        lambda d: d["spec"]["predictor"].__setitem__("contianers", d["spec"]["predictor"].pop("containers")),
    ),
    ("wrong type", lambda d: d["spec"]["predictor"].__setitem__("minReplicas", "two")),
    ("unknown container field", lambda d: d["spec"]["predictor"]["containers"][0].__setitem__("imagePolicy", "Always")),
]


@pytest.mark.parametrize("what, damage", BROKEN_SERVICE, ids=[b[0] for b in BROKEN_SERVICE])
def test_a_broken_inference_service_fails_validation(what, damage, inference_service_schema):
    doc = _inference_service()
    damage(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(inference_service_schema).validate(doc)


def _probe_port(probe: dict, container: dict) -> int:
    port = (probe.get("httpGet") or probe["grpc"])["port"]
    return port if isinstance(port, int) else next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def _probe_target(probe: dict) -> str:
    """What a probe asks: an HTTP path, or a grpc.health.v1 service."""
    return probe["httpGet"]["path"] if "httpGet" in probe else f"grpc:{probe['grpc'].get('service', '')}"


@pytest.mark.parametrize("kustomization", ["base", "overlays/cpu", "overlays/gpu"])
def test_deployments_agree_with_the_image_the_settings_and_the_app(kustomization, dockerfile):
    docs = _by_kind(_render(K8S / kustomization))
    deployment, config = docs["Deployment"], docs["ConfigMap"]
    (container,) = _containers(deployment)
    image = dockerfile
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert container["image"].split(":")[1].split("-")[0] == version
    assert container["command"] == image["cmd"] and "args" not in container
    assert (
        [p["containerPort"] for p in container["ports"]]
        == image["exposed"]
        == [int(config["data"]["CALIB_PORT"]), int(config["data"]["CALIB_GRPC_PORT"])]
    )
    assert [p["name"] for p in container["ports"]] == ["http", "grpc"]
    for name in config["data"]:
        assert name == "MPLCONFIGDIR" or setting_path(name) is not None, name
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert secrets == {
        "CALIB_STORE__URL": {"name": "calibrated-serving", "key": "database-url"},
        "CALIB_AUTH__ADMIN_TOKENS": {"name": "calibrated-serving", "key": "admin-tokens"},
        "CALIB_AUTH__PREDICT_TOKENS": {"name": "calibrated-serving", "key": "predict-tokens"},
        "CALIB_AUTH__FEEDBACK_TOKENS": {"name": "calibrated-serving", "key": "feedback-tokens"},
    }
    routes = set(create_app(Settings()).openapi()["paths"])
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container[kind]
        if "httpGet" in probe:
            assert probe["httpGet"]["path"] in routes and _probe_port(probe, container) == image["expose"]
        else:  # the gRPC listener's health service (grpc.health.v1), on the gRPC port
            assert probe["grpc"]["service"] == SERVICE
            assert _probe_port(probe, container) == int(config["data"]["CALIB_GRPC_PORT"])
    # each listener is probed: HTTP by the startup and liveness probes, gRPC by the readiness probe
    assert {"httpGet", "grpc"} <= {key for kind in ("livenessProbe", "readinessProbe") for key in container[kind]}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == image["uid"]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    writable = {m["mountPath"] for m in container["volumeMounts"]}
    assert writable == {"/tmp"} and config["data"]["MPLCONFIGDIR"].startswith("/tmp/")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    sleep = float(re.search(r"sleep\((\d+(?:\.\d+)?)\)", pre_stop).group(1))
    assert pod["terminationGracePeriodSeconds"] >= float(config["data"]["CALIB_GRACEFUL_SHUTDOWN_SECONDS"]) + sleep + 5
    assert deployment["spec"]["selector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert docs["Service"]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert docs["PodDisruptionBudget"]["spec"]["selector"] == deployment["spec"]["selector"]
    target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    gpu = "gpu" in kustomization
    assert (config["data"].get("CALIB_DEVICE", "auto") == "cuda") == gpu
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) == gpu
    assert container["image"].endswith("-gpu") == gpu


def test_the_inference_service_runs_the_deployments_container():
    (deployment,) = [d for d in _load(K8S / "base" / "deployment.yaml")]
    (ours,) = _containers(deployment)
    (theirs,) = _containers(_inference_service())
    assert [e for e in theirs["env"] if e["name"] != "PROTOCOL"] == ours["env"]
    for key in ("image", "command", "envFrom", "resources", "securityContext", "volumeMounts", "lifecycle"):
        assert theirs[key] == ours[key], key
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert {**theirs[kind], "httpGet": None, "grpc": None} == {**ours[kind], "httpGet": None, "grpc": None}
        assert _probe_target(theirs[kind]) == _probe_target(ours[kind])
        assert _probe_port(theirs[kind], theirs) == _probe_port(ours[kind], ours)
    predictor, pod = _inference_service()["spec"]["predictor"], deployment["spec"]["template"]["spec"]
    for key in ("securityContext", "terminationGracePeriodSeconds", "volumes", "automountServiceAccountToken"):
        assert predictor[key] == pod[key], key


def test_the_compose_file_runs_the_same_command(dockerfile):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    (container,) = _containers(_load(K8S / "base" / "deployment.yaml")[0])
    assert compose["services"]["service"]["command"] == container["command"] == dockerfile["cmd"]


def test_the_prometheus_rule_is_rendered_from_the_alert_rules():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "k8s_prometheus_rule.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    rule = _by_kind(_render(K8S / "prometheus-operator"))["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())


def test_the_service_monitor_scrapes_the_services_metrics_port():
    monitor = _by_kind(_render(K8S / "prometheus-operator"))["ServiceMonitor"]
    service = _by_kind(_render(K8S / "base"))["Service"]
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "grpc"]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"]  # /metrics is on the HTTP port
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_the_kserve_crd_is_vendored_with_its_source_and_licence():
    note = (KSERVE / "crd" / "README.md").read_text()
    assert "kserve/kserve" in note and "Apache License, Version 2.0" in note
    shared = ROOT.parent / "shared" / "k8s" / "serving.kserve.io_inferenceservices.yaml"
    if shared.exists():  # the copy this project vendored: unchanged
        assert shared.read_bytes() == (KSERVE / "crd" / "serving.kserve.io_inferenceservices.yaml").read_bytes()


def test_the_secret_is_referenced_never_committed():
    for path in [*K8S.rglob("*.yaml"), KSERVE / "inferenceservice.yaml"]:
        for doc in _load(path):
            assert doc.get("kind") != "Secret", path


def test_a_patch_that_matches_nothing_is_an_error(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [str(K8S / "base")], "patches": [{"path": "typo.yaml"}]})
    )
    (overlay / "typo.yaml").write_text(
        yaml.safe_dump(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "calibrated-servin"}, "spec": {}}
        )
    )
    with pytest.raises(AssertionError, match="patches no resource"):
        _render(overlay)


def test_the_network_policy_admits_only_labelled_clients_and_prometheus():
    docs = _render(K8S / "base")
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    clients, prometheus = policy["spec"]["ingress"]
    assert {p["port"] for p in clients["ports"]} == ports == {"http", "grpc"}
    assert [peer.get("podSelector", peer.get("namespaceSelector")) for peer in clients["from"]] == [
        {"matchLabels": {"calibrated-serving/client": "true"}}
    ] * 2
    assert [p["port"] for p in prometheus["ports"]] == ["http"]
    assert prometheus["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    assert "calibrated-serving/client" in (ROOT / "docs" / "security.md").read_text()
