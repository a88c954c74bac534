"""Route-group tokens: who may predict, label and administer (docs/security.md)."""

import logging
import socket
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

from bench.common import loopback
from service.auth import ACCESS, ANONYMOUS, AccessControl, parse_tokens
from service.errors import Forbidden, Unauthorized
from service.serving.protocol import grpc_predict_v2_pb2 as pb
from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc
from service.settings import Settings
from training.data import load_digits_splits

DIGITS = load_digits_splits().test
TOKENS = {
    "predict": "p-0123456789abcdef",
    "predict-next": "p-fedcba9876543210",
    "feedback": "f-0123456789abcdef",
    "admin": "a-0123456789abcdef",
}
NAMES = ("app-blue", "app-green", "labeller-one", "ops")


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guarded(repository_dir, server_for, tmp_path, caplog):
    """A server with tokens on every group (two predict tokens, as in a rotation); its log captured."""
    settings = Settings(
        artifacts=repository_dir,
        default_model="digits-lenet5",
        store={"url": f"sqlite:///{tmp_path / 'store.db'}"},
        auth={
            "predict_tokens": f"{NAMES[0]}:{TOKENS['predict']},{NAMES[1]}:{TOKENS['predict-next']}",
            "feedback_tokens": f"{NAMES[2]}:{TOKENS['feedback']}",
            "admin_tokens": f"{NAMES[3]}:{TOKENS['admin']}",
        },
    )
    caplog.set_level(logging.DEBUG)
    with server_for(settings) as (base_url, app):
        yield base_url, app


def test_token_lists_are_parsed_and_errors_name_the_entry_never_the_token():
    assert parse_tokens("a:x1, b:y2\n# a comment\nc:z:3\n", "T") == {"a": b"x1", "b": b"y2", "c": b"z:3"}
    for text, problem in [
        ("a:x,noname", "entry 2 is not name:token"),
        (":secret-value", "entry 1"),
        ("a:", "entry 1"),
        ("a:x,a:secret-value", "'a' is given twice"),
    ]:
        with pytest.raises(ValueError, match=problem) as error:
            parse_tokens(text, "CALIB_AUTH__PREDICT_TOKENS")
        assert "secret-value" not in str(error.value) and "CALIB_AUTH__PREDICT_TOKENS" in str(error.value)
    with pytest.raises(ValueError) as error:
        Settings(auth={"feedback_tokens": "labeller:secret-value,oops"})
    assert "CALIB_AUTH__FEEDBACK_TOKENS: entry 2" in str(error.value) and "secret-value" not in str(error.value)


def test_a_groups_tokens_are_given_one_way_and_the_refusal_names_both_variables(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("labeller:secret-value\n")
    with pytest.raises(ValueError) as error:
        Settings(auth={"feedback_tokens": "fixed:secret-value", "feedback_tokens_file": path})
    message = str(error.value)
    assert "CALIB_AUTH__FEEDBACK_TOKENS and CALIB_AUTH__FEEDBACK_TOKENS_FILE are both set" in message
    assert "secret-value" not in message


def test_each_group_takes_only_its_own_tokens_compared_with_every_one(tmp_path):
    access = AccessControl(Settings(auth={"predict_tokens": "a:tok-a,b:tok-b", "admin_tokens": "admin:root"}))
    assert access.check("predict", "Bearer tok-a") == "a" and access.check("predict", "bearer  tok-b ") == "b"
    assert access.check("feedback", None) == ANONYMOUS  # an open group
    assert access.check("admin", "BEARER root") == "admin"
    for header, challenge in [
        (None, 'Bearer realm="calibrated-serving"'),
        ("Basic tok-a", None),
        ("Bearer", None),
        ("Bearer tok-c", 'Bearer realm="calibrated-serving", error="invalid_token"'),
        ("Bearer root", None),
    ]:
        with pytest.raises(Unauthorized) as refused:
            access.check("predict", header)
        assert challenge is None or refused.value.headers["WWW-Authenticate"] == challenge
    with pytest.raises(Forbidden):
        AccessControl(Settings()).check("admin", "Bearer anything")
    assert access.allows("admin", "Bearer root") and not access.allows("feedback", None)


def test_every_route_and_grpc_method_declares_its_access_group_and_one_without_is_refused_at_start():
    from fastapi import FastAPI
    from starlette.routing import Route as StarletteRoute

    from service.app import create_app
    from service.http.routes import ROUTES, Route, RouteAccess
    from service.serving.grpc_server import InferenceServicer, method_access, rpc

    app = create_app(Settings())
    groups = RouteAccess.of_app(app)
    assert all(route.access in ACCESS for route in ROUTES)
    assert {getattr(r, "path", None) for r in app.routes} <= {*groups.exact, *(r.path for r in ROUTES)}
    assert [
        groups.of(p)
        for p in [
            "/predict",
            "/v2/models/m/versions/1/infer",
            "/v2/models/m/infer",
            "/v2/models/m",
            "/feedback",
            "/feedback/unmatched",
            "/admin/recalibrate",
            "/calibration",
            "/metrics",
            "/docs",
            "/no/such/route",
        ]
    ] == ["predict", "predict", "predict", "open", "feedback", "feedback", "admin", "open", "open", "open", None]
    # a table entry without a group, or with an unknown one, is refused where it is declared
    for access in (None, "public"):
        with pytest.raises(ValueError, match="declares no access group"):
            Route("/new", ROUTES[0].handler, access=access)  # type: ignore[arg-type]
    # a route the app serves outside the table: no start (fail closed)
    app.router.routes.append(StarletteRoute("/v3/infer", ROUTES[0].handler, methods=["POST"]))
    with pytest.raises(RuntimeError, match=r"routes without an access group.*/v3/infer"):
        RouteAccess.of_app(app)
    assert RouteAccess.of_app(FastAPI()).of("/docs") == "open"
    # gRPC: every method of the service declares one; ModelInfer is predict's
    declared = method_access(InferenceServicer.__new__(InferenceServicer))
    assert declared["ModelInfer"] == "predict" and set(declared.values()) == {"predict", "open"}
    with pytest.raises(ValueError, match="declares no access group"):
        rpc("public")  # type: ignore[arg-type]

    class Undeclared(InferenceServicer):
        async def ModelInfer(self, request):  # overridden without rpc(...)
            return None

    with pytest.raises(RuntimeError, match=r"gRPC methods without an access group.*ModelInfer"):
        method_access(Undeclared.__new__(Undeclared))


def test_a_token_file_is_reread_when_it_changes_and_a_broken_one_keeps_the_last_tokens(tmp_path):
    path = tmp_path / "feedback-tokens"
    path.write_text("old:token-old\n")
    access = AccessControl(Settings(auth={"feedback_tokens_file": path}))
    assert access.check("feedback", "Bearer token-old") == "old"
    path.write_text("old:token-old\nnew:token-new\n")  # rotation, step 1: both valid
    assert access.reload() and access.check("feedback", "Bearer token-new") == "new"
    assert access.check("feedback", "Bearer token-old") == "old"
    path.write_text("new:token-new\n")  # step 3: the old one removed
    time.sleep(0.01)
    assert access.reload()
    with pytest.raises(Unauthorized):
        access.check("feedback", "Bearer token-old")
    path.write_text("new:token-new,broken")
    assert not access.reload() and access.check("feedback", "Bearer token-new") == "new"
    path.unlink()
    with pytest.raises(ValueError, match="CALIB_AUTH__FEEDBACK_TOKENS_FILE"):
        AccessControl(Settings(auth={"feedback_tokens_file": path}))


def test_requests_without_their_groups_token_are_refused_in_each_routes_format(guarded):
    base_url, _ = guarded
    rows = {"inputs": DIGITS.x[:2].tolist()}
    v2 = {
        "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": DIGITS.x[0].ravel().tolist()}]
    }
    for headers in ({}, _bearer("nope"), _bearer(TOKENS["feedback"])):
        r = loopback.post(f"{base_url}/predict", json=rows, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
        assert r.headers["www-authenticate"].startswith('Bearer realm="calibrated-serving"')
        r = loopback.post(f"{base_url}/v2/models/digits-lenet5/infer", json=v2, headers=headers)
        assert r.status_code == 401 and isinstance(r.json()["error"], str), r.text
    ids = []
    for token in ("predict", "predict-next"):  # two valid at once
        r = loopback.post(f"{base_url}/predict", json=rows, headers=_bearer(TOKENS[token]))
        assert r.status_code == 200, r.text
        ids += [p["id"] for p in r.json()["predictions"]]
    assert (
        loopback.post(
            f"{base_url}/v2/models/digits-lenet5/infer", json=v2, headers=_bearer(TOKENS["predict"])
        ).status_code
        == 200
    )
    items = {"items": [{"prediction_id": i, "label": 1} for i in ids]}
    assert loopback.post(f"{base_url}/feedback", json=items, headers=_bearer(TOKENS["predict"])).status_code == 401
    assert loopback.get(f"{base_url}/feedback/unmatched").status_code == 401
    r = loopback.post(f"{base_url}/feedback", json=items, headers=_bearer(TOKENS["feedback"]))
    assert r.status_code == 200 and r.json()["accepted"] == 4, r.text
    assert (
        loopback.post(
            f"{base_url}/admin/calibration/activate",
            json={"calibration_version": 0},
            headers=_bearer(TOKENS["feedback"]),
        ).status_code
        == 401
    )
    assert (
        loopback.post(
            f"{base_url}/admin/calibration/activate", json={"calibration_version": 0}, headers=_bearer(TOKENS["admin"])
        ).status_code
        == 200
    )
    for path in ("/health", "/metrics", "/calibration", "/models", "/v2/models/digits-lenet5", "/v2/health/ready"):
        assert loopback.get(f"{base_url}{path}").status_code == 200, path


def test_the_token_is_checked_before_the_body_is_read(guarded):
    base_url, _ = guarded
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        # headers announcing a large body, of which nothing is sent: the answer comes anyway
        connection.sendall(
            b"POST /feedback HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        answer = connection.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 401"), answer
    assert "connection: close" in answer.lower()


def test_grpc_model_infer_takes_the_predict_tokens_in_its_metadata(guarded):
    base_url, _ = guarded
    port = loopback.get(f"{base_url}/health").json()["grpc_port"]
    request = pb.ModelInferRequest(model_name="digits-lenet5")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(np.asarray(DIGITS.x[:1], dtype="<f4").tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer nope"),), (("authorization", f"Bearer {TOKENS['admin']}"),)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = stub.ModelInfer(request, metadata=(("authorization", f"Bearer {TOKENS['predict-next']}"),))
        assert answer.model_name == "digits-lenet5" and len(answer.raw_output_contents) == 5  # every listed output
        assert stub.ServerReady(pb.ServerReadyRequest()).ready  # readiness and metadata stay open


def test_no_token_nor_its_name_appears_in_logs_metrics_or_health(guarded, caplog):
    base_url, _ = guarded
    loopback.post(f"{base_url}/predict", json={"inputs": DIGITS.x[:1].tolist()}, headers=_bearer(TOKENS["predict"]))
    loopback.post(f"{base_url}/predict", json={"inputs": DIGITS.x[:1].tolist()}, headers=_bearer("wrong-token-text"))
    logged = "\n".join(r.getMessage() for when in ("setup", "call") for r in caplog.get_records(when))
    exposed = [
        logged,
        loopback.get(f"{base_url}/metrics").text,
        loopback.get(f"{base_url}/health", headers=_bearer(TOKENS["admin"])).text,
        loopback.get(f"{base_url}/openapi.json").text,
    ]
    assert "tokens required for: predict, feedback, admin" in logged
    for text in exposed:
        for secret in [*TOKENS.values(), *NAMES, "wrong-token-text"]:
            assert secret not in text


def test_a_bad_token_setting_stops_the_start_naming_the_variable_not_the_token(tmp_path):
    import os

    env = dict(os.environ, CALIB_AUTH__PREDICT_TOKENS="app:secret-value,oops", CALIB_PORT="0")
    done = subprocess.run([sys.executable, "-m", "service"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CALIB_AUTH__PREDICT_TOKENS: entry 2" in done.stdout, done.stdout + done.stderr
    assert "secret-value" not in done.stdout + done.stderr
    env = dict(os.environ, CALIB_AUTH__ADMIN_TOKENS_FILE=str(tmp_path / "missing"), CALIB_PORT="0")
    done = subprocess.run([sys.executable, "-m", "service"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CALIB_AUTH__ADMIN_TOKENS_FILE" in done.stdout, done.stdout + done.stderr
