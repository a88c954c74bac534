"""The Open Inference Protocol over gRPC, driven by tritonclient.grpc unchanged (in a process of its own, see
tests/conformance/triton_grpc_client.py): readiness, metadata, inference with raw tensor contents, typed errors
as gRPC status codes, the same probabilities as REST to the bit, prediction ids that take feedback, and metrics."""

import ast
import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pool
from prometheus_client.parser import text_string_to_metric_families

from bench.common import loopback
from service.serving.protocol import grpc_predict_v2_pb2 as ours
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
LIGHT, LIGHT_SHAPE = "digits-lenet5", [1, 8, 8]


def _grpc_client(base_url: str, shapes: dict) -> dict:
    port = loopback.get(f"{base_url}/health").json()["grpc_port"]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "conformance" / "triton_grpc_client.py"),
            f"127.0.0.1:{port}",
            json.dumps(shapes),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _grpc_calls(base_url: str) -> dict[tuple[str, str], float]:
    families = {f.name: f for f in text_string_to_metric_families(loopback.get(f"{base_url}/metrics").text)}
    return {
        (s.labels["method"], s.labels["code"]): s.value
        for s in families["calib_grpc_requests"].samples
        if s.name.endswith("_total")
    }


@pytest.fixture(scope="session")
def check_model(rest_probabilities, ids_take_feedback):
    """``check(base_url, got, model, shape)``: what tritonclient.grpc got for ``model`` (``triton_grpc_client.py``):
    readiness, metadata, the probabilities REST answers for the same rows, ids that take feedback, and a bad
    shape refused."""

    def check(base_url: str, got: dict, model: str, shape: list[int]) -> None:
        assert got["ready"] is True
        meta = got["metadata"]
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [str(d) for d in [-1, *shape]]}]
        versions = {m["name"]: m["versions"][0] for m in loopback.get(f"{base_url}/models").json()["models"]}
        with_sets = [("prediction_set", "BOOL"), ("conformal_p_values", "FP32")]
        assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [
            ("logits", "FP32"),
            ("probabilities", "FP32"),
            ("prediction_id", "BYTES"),
            *(with_sets if versions[model]["prediction_sets"]["available"] else []),
        ]
        infer = got["infer"]
        np.testing.assert_array_equal(
            np.asarray(infer["probabilities"], np.float32), rest_probabilities(base_url, model, shape)
        )
        assert infer["parameters"]["prediction_ids"]["string_param"].split(",") == infer["ids"]
        assert len(set(infer["ids"])) == 3 and len(infer["id"]) == 32 and infer["model_version"] == "1"
        ids_take_feedback(base_url, infer["ids"])
        assert got["bad_shape"]["status"] == "StatusCode.INVALID_ARGUMENT"
        assert got["bad_shape"]["message"].startswith("inputs[0].shape: shape [3")

    return check


def _fields(message) -> dict:
    """Every field of a message and of its nested messages (map entries included): number, type, label, the
    message or enum it holds, and its oneof."""
    out = {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in message.fields
    }
    for nested in message.nested_types:
        out |= {f"{nested.name}.{k}": v for k, v in _fields(nested).items()}
    return out


def test_the_proto_is_the_vendored_spec_field_for_field(tmp_path):
    """Every message, field number, type and method of the protocol's own ``grpc_predict_v2.proto`` (third_party/oip,
    KServe's; compiled here with grpc_tools) is the service's. The service's adds only what Triton's later
    revision of the same file adds (``InferParameter``'s double_param = 4 and uint64_param = 5, which tritonclient
    sends), at numbers the spec leaves free: wire-compatible both ways."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    spec = ROOT / "third_party" / "oip"
    out = tmp_path / "spec.pb"
    assert protoc.main(["protoc", f"-I{spec}", f"--descriptor_set_out={out}", "grpc_predict_v2.proto"]) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    theirs_file = pool.FindFileByName("grpc_predict_v2.proto")
    assert theirs_file.package == ours.DESCRIPTOR.package == "inference"
    assert set(theirs_file.message_types_by_name) == set(ours.DESCRIPTOR.message_types_by_name)
    added = {}
    for name, message in ours.DESCRIPTOR.message_types_by_name.items():
        mine, spec_fields = _fields(message), _fields(theirs_file.message_types_by_name[name])
        assert {k: mine.get(k) for k in spec_fields} == spec_fields, name
        added |= {f"{name}.{k}": v[0] for k, v in mine.items() if k not in spec_fields}
        assert not {v[0] for k, v in mine.items() if k not in spec_fields and "." not in k} & {
            v[0] for k, v in spec_fields.items() if "." not in k
        }, name
    assert added == {"InferParameter.double_param": 4, "InferParameter.uint64_param": 5}
    mine, theirs = (f.services_by_name["GRPCInferenceService"] for f in (ours.DESCRIPTOR, theirs_file))
    assert {m.name: (m.input_type.full_name, m.output_type.full_name) for m in mine.methods} == {
        m.name: (m.input_type.full_name, m.output_type.full_name) for m in theirs.methods
    }


def test_the_messages_are_the_protocols_as_tritonclient_speaks_them():
    """Field numbers and types of every message, and the service's methods, equal those of tritonclient's own
    descriptors (read from its module's source into a pool of their own: one process cannot import both)."""
    pool = descriptor_pool.DescriptorPool()
    folder = Path(importlib.util.find_spec("tritonclient").submodule_search_locations[0]) / "grpc"
    for module in ("model_config_pb2.py", "service_pb2.py"):
        tree = ast.parse((folder / module).read_text())
        serialized = next(
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile"
        )
        pool.AddSerializedFile(serialized)

    for name, message in ours.DESCRIPTOR.message_types_by_name.items():
        theirs = pool.FindMessageTypeByName(f"inference.{name}")
        mine = _fields(message)
        assert mine == {k: v for k, v in _fields(theirs).items() if k in mine}, name
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    for method in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"):
        theirs = service.FindMethodByName(method)
        mine = ours.DESCRIPTOR.services_by_name["GRPCInferenceService"].FindMethodByName(method)
        assert (mine.input_type.full_name, mine.output_type.full_name) == (
            theirs.input_type.full_name,
            theirs.output_type.full_name,
        )


def test_tritonclient_grpc_serves_the_light_model_as_rest_does(base_url, check_model):
    before = _grpc_calls(base_url)
    got = _grpc_client(base_url, {LIGHT: LIGHT_SHAPE})
    assert got["live"] and got["ready"] and got["server"]["name"] == "calibrated-serving"
    check_model(base_url, got["models"][LIGHT], LIGHT, LIGHT_SHAPE)
    unknown = got["unknown_model"]
    assert unknown["status"] == "StatusCode.NOT_FOUND" and "no-such-model" in unknown["message"]
    assert got["unknown_metadata"]["status"] == "StatusCode.NOT_FOUND"
    after = _grpc_calls(base_url)
    grew = {key: after[key] - before.get(key, 0.0) for key in after}
    assert grew[("ModelInfer", "OK")] == 1 and grew[("ModelInfer", "INVALID_ARGUMENT")] == 1
    assert grew[("ModelInfer", "NOT_FOUND")] == 1 and grew[("ServerLive", "OK")] == 1


@pytest.mark.e2e  # builds the heavy model with torch
def test_tritonclient_grpc_serves_the_heavy_model_as_rest_does(repository_dir, tmp_path, server_for, check_model):
    from training.untrained import untrained_artifact

    heavy, shape = "cifar-resnet56", [3, 32, 32]
    if not (repository_dir.parent / "heavy").exists():
        untrained_artifact(repository_dir.parent / "heavy", heavy)
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / heavy).symlink_to(repository_dir.parent / "heavy" / heavy)
    (root / LIGHT).symlink_to(repository_dir / LIGHT)
    settings = Settings(artifacts=root, default_model=LIGHT, store={"url": f"sqlite:///{tmp_path / 'm.db'}"})
    with server_for(settings) as (base_url, _):
        got = _grpc_client(base_url, {heavy: shape, LIGHT: LIGHT_SHAPE})
        for model, model_shape in ((heavy, shape), (LIGHT, LIGHT_SHAPE)):
            check_model(base_url, got["models"][model], model, model_shape)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the refused start
def test_grpc_can_be_off_and_a_taken_port_stops_the_start(repository_dir, tmp_path, server_for):
    settings = Settings(artifacts=repository_dir, grpc=False, store={"url": f"sqlite:///{tmp_path / 'off.db'}"})
    with server_for(settings) as (base_url, _):
        assert loopback.get(f"{base_url}/health").json()["grpc_port"] is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = Settings(
            artifacts=repository_dir,
            grpc_port=taken.getsockname()[1],
            store={"url": f"sqlite:///{tmp_path / 'taken.db'}"},
        )
        with pytest.raises(RuntimeError, match="did not start"), server_for(settings):
            pass


def _stub(base_url: str):
    import grpc

    from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc

    port = loopback.get(f"{base_url}/health").json()["grpc_port"]
    return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def _request(x: np.ndarray | None = None, **fields) -> "ours.ModelInferRequest":
    x = np.random.default_rng(0).random((2, *LIGHT_SHAPE), dtype=np.float32) if x is None else x
    request = ours.ModelInferRequest(model_name=LIGHT, **fields)
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request


HOSTILE = {
    "two raw entries for one input": (
        lambda r: r.raw_input_contents.append(b"\0" * 4),
        "INVALID_ARGUMENT",
        "raw_input_contents: holds 2 entries for 1 inputs",
    ),
    "a byte short": (
        lambda r: r.raw_input_contents.__setitem__(0, r.raw_input_contents[0][:-1]),
        "INVALID_ARGUMENT",
        "raw_input_contents[0]: 511 bytes are not a whole number of FP32 values",
    ),
    "values short of the shape": (
        lambda r: r.raw_input_contents.__setitem__(0, r.raw_input_contents[0][:-4]),
        "INVALID_ARGUMENT",
        "inputs[0].data: holds 127 values but shape [2, 1, 8, 8]",
    ),
    "NaN": (
        lambda r: r.raw_input_contents.__setitem__(0, np.full(128, np.nan, np.float32).tobytes()),
        "INVALID_ARGUMENT",
        "inputs[0].data: contains NaN",
    ),
    "an unsupported datatype": (
        lambda r: setattr(r.inputs[0], "datatype", "BYTES"),
        "INVALID_ARGUMENT",
        "inputs[0].datatype: datatype 'BYTES' is not supported",
    ),
    "FP16 as typed contents": (
        lambda r: (
            r.ClearField("raw_input_contents"),
            setattr(r.inputs[0], "datatype", "FP16"),
            r.inputs[0].contents.fp32_contents.extend([0.5] * 128),
        ),
        "INVALID_ARGUMENT",
        "inputs[0].contents: FP16 values travel only as raw_input_contents",
    ),
    "a wrong input name": (lambda r: setattr(r.inputs[0], "name", "pixels"), "INVALID_ARGUMENT", "inputs[0].name"),
    "an unknown output": (lambda r: r.outputs.add(name="nope"), "INVALID_ARGUMENT", "outputs: unknown outputs"),
    "an unknown version": (lambda r: setattr(r, "model_version", "9"), "NOT_FOUND", "version: model 'digits-lenet5'"),
    "no input": (
        lambda r: (r.ClearField("inputs"), r.ClearField("raw_input_contents")),
        "INVALID_ARGUMENT",
        "inputs: List should have at least 1 item",
    ),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_grpc_requests_end_with_the_status_of_their_kind_naming_the_field(base_url, case):
    import grpc

    damage, status, message = HOSTILE[case]
    request = _request()
    damage(request)
    with pytest.raises(grpc.RpcError) as raised:
        _stub(base_url).ModelInfer(request, timeout=30)
    assert raised.value.code().name == status and raised.value.details().startswith(message), raised.value.details()


def test_typed_contents_answer_as_raw_contents_do_and_a_message_past_the_limit_is_refused(base_url, server):
    import grpc

    stub = _stub(base_url)
    x = np.random.default_rng(1).random((2, *LIGHT_SHAPE), dtype=np.float32)
    raw = stub.ModelInfer(_request(x, id="req-7"), timeout=30)
    typed = ours.ModelInferRequest(model_name=LIGHT)
    typed.inputs.add(name="input", datatype="FP32", shape=list(x.shape)).contents.fp32_contents.extend(x.ravel())
    answer = stub.ModelInfer(typed, timeout=30)
    listed = [o.name for o in stub.ModelMetadata(ours.ModelMetadataRequest(name=LIGHT), timeout=30).outputs]
    # no outputs named: every output the metadata lists, as over REST
    assert raw.id == "req-7" and [o.name for o in raw.outputs] == listed
    assert listed[:3] == ["logits", "probabilities", "prediction_id"]
    assert raw.raw_output_contents[1] == answer.raw_output_contents[1]  # the probabilities, to the bit
    limit = server[1].state.parts.settings.limits.max_body_bytes
    huge = _request(np.zeros((limit // 256 + 1, *LIGHT_SHAPE), np.float32))
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(huge, timeout=30)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_grpc_health_answers_serving_while_ready_open_to_all_and_not_serving_when_not(
    repository_dir, tmp_path, server_for
):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from service.serving.grpc_server import SERVICE

    settings = Settings(
        artifacts=repository_dir,
        auth={"predict_tokens": "app:secret-token"},
        store={"url": f"sqlite:///{tmp_path / 'health.db'}"},
    )
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    with server_for(settings) as (base_url, app):
        port = loopback.get(f"{base_url}/health").json()["grpc_port"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status(service: str) -> int:
                return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status

            assert status("") == status(SERVICE) == serving
            with pytest.raises(grpc.RpcError) as unknown:
                status("no.such.Service")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=20)
            assert next(watch).status == serving
            parts = app.state.parts
            parts.ready = False  # what the shutdown sets first, and a service with no model ready
            try:
                assert status("") == status(SERVICE) == not_serving
                assert loopback.get(f"{base_url}/v2/health/ready").status_code != 200  # the same readiness as REST
                assert next(watch).status == not_serving  # watchers hear of it within Health.POLL_SECONDS
            finally:
                parts.ready = True
            assert status(SERVICE) == serving and next(watch).status == serving
            watch.cancel()
