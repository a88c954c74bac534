"""Prediction sets served per request: JSON /predict, v2 (JSON, binary, tritonclient) and gRPC return the sets of
the artifact's conformal calibrators, recomputable from the response alone: by default the floor sets, never empty
and the same for the same input, on request the exact (randomized) ones; only at the declared coverage levels; and
refuse what they cannot serve."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from bench.common import loopback
from service.serving.conformal import ServedSets, SetChoice, row_draws
from service.settings import Settings

CLASSES = ("a", "b", "c", "d", "e")  # the classes of ``add_conformal``'s calibrators
LEVELS = (0.5, 0.7, 0.75, 0.85, 0.9)  # served besides the artifact's default, 0.8


@pytest.fixture(scope="module")
def served(tmp_path_factory, server_for, linear_artifact, add_conformal):
    """A server with a toy model that has sets (``sets``, version 1) and one that has none (``plain``)."""
    root = tmp_path_factory.mktemp("sets")
    calibrators = add_conformal(linear_artifact(root, "sets", "1", classes=CLASSES, seed=3))
    linear_artifact(root, "plain", "1", classes=CLASSES, seed=4)
    settings = Settings(
        artifacts=root,
        default_model="sets",
        store={"url": f"sqlite:///{root / 'm.db'}"},
        conformal={"levels": ",".join(map(str, LEVELS))},
    )
    with server_for(settings) as (base_url, _):
        yield base_url, calibrators


def rows(n: int, seed: int = 0) -> list:
    return np.random.default_rng(seed).normal(0, 1, (n, 1, 2, 2)).round(4).tolist()


def expected_sets(calibrators, body: dict, method: str, coverage: float, randomized: bool = False) -> np.ndarray:
    """The sets recomputed from the response alone: its probabilities (calibration version 0, the graph's) and,
    for the exact sets, the draws of its prediction ids."""
    probs = np.array([p["probabilities"] for p in body["predictions"]])
    ids = [p["id"] for p in body["predictions"]]
    if not randomized:
        return calibrators["floor"][method].sets(probs, 1 - coverage)
    return calibrators[method].sets(probs, 1 - coverage, u=row_draws(ids) if method != "lac" else None)


def test_predict_serves_the_default_floor_sets_recomputable_from_the_response(served):
    base_url, calibrators = served
    body = loopback.post(f"{base_url}/predict", json={"inputs": rows(40)}).json()
    assert body["conformal"]["method"] == "aps" and body["conformal"]["coverage"] == 0.8
    assert body["conformal"]["randomized"] is False and body["conformal"]["threshold_version"].endswith(":0")
    assert body["conformal"]["threshold"] == pytest.approx(calibrators["floor"]["aps"].quantile(0.2))
    sets = expected_sets(calibrators, body, "aps", 0.8)
    for row, members in zip(body["predictions"], sets):
        assert set(row["prediction_set"]) == {CLASSES[k] for k in np.flatnonzero(members)}
        assert row["set_size"] == len(row["prediction_set"]) >= 1 and row["p_values"] is None
        shown = [row["probabilities"][CLASSES.index(label)] for label in row["prediction_set"]]
        assert shown == sorted(shown, reverse=True)  # most probable first
        assert row["prediction_set"][0] == row["label"]  # the floor: the most probable label is always in


def test_one_input_sent_a_thousand_times_gets_one_non_empty_set(served):
    """The floor sets are a function of the input: the same set under the same threshold version, every time,
    and it holds the top label (randomized sets drew from each prediction id, and could leave it out)."""
    base_url, _ = served
    x = rows(1, seed=11)
    with httpx.Client(base_url=base_url, timeout=30) as client:
        answers = {
            (tuple(p["prediction_set"]), body["conformal"]["threshold_version"])
            for body in (client.post("/predict", json={"inputs": x}).json() for _ in range(1_000))
            for p in body["predictions"]
        }
    assert len(answers) == 1 and len(next(iter(answers))[0]) >= 1


def test_a_request_asks_for_the_exact_randomized_sets(served):
    base_url, calibrators = served
    for method in ("lac", "aps", "raps"):
        body = loopback.post(
            f"{base_url}/predict", json={"inputs": rows(60, seed=3), "randomized": True, "set_method": method}
        ).json()
        assert body["conformal"]["randomized"] is True
        got = np.array([[label in p["prediction_set"] for label in CLASSES] for p in body["predictions"]])
        np.testing.assert_array_equal(got, expected_sets(calibrators, body, method, 0.8, randomized=True))


def test_a_batch_lists_each_rows_set_most_probable_first_and_a_request_gets_its_rows():
    order = np.array([[1, 3, 0, 2], [1, 2, 0, 3], [0, 1, 2, 3]])
    batch = ServedSets(SetChoice("lac", 0.9), order, np.array([3, 2, 0]), None, 0.5, "x:0", False)
    assert batch.members_ranked() == [[1, 3, 0], [1, 2], []]
    np.testing.assert_array_equal(batch.members, [[1, 1, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]])
    share = batch.listed()[1:3]
    assert share.ranked == [[1, 2], []] and share.packed() == batch[1:3].packed() == [bytes([0b01100000]), b"\0"]
    np.testing.assert_array_equal(share.members, batch.members[1:3])


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_a_request_chooses_method_and_coverage_and_higher_coverage_nests_the_sets(served, method):
    base_url, calibrators = served
    x = rows(30, seed=1)
    bodies = {
        c: loopback.post(f"{base_url}/predict", json={"inputs": x, "coverage": c, "set_method": method}).json()
        for c in (0.5, 0.9)
    }
    for coverage, body in bodies.items():
        assert (body["conformal"]["method"], body["conformal"]["coverage"]) == (method, coverage)
        got = np.array([[label in p["prediction_set"] for label in CLASSES] for p in body["predictions"]])
        np.testing.assert_array_equal(got, expected_sets(calibrators, body, method, coverage))
    # the same rows: the floor sets, a function of the row, nest as the coverage grows
    for low, high in zip(bodies[0.5]["predictions"], bodies[0.9]["predictions"]):
        assert set(low["prediction_set"]) <= set(high["prediction_set"])


def test_p_values_are_returned_when_asked_and_their_level_sets_are_the_sets(served):
    base_url, _ = served
    body = loopback.post(
        f"{base_url}/predict", json={"inputs": rows(25, seed=2), "return_p_values": True, "coverage": 0.7}
    ).json()
    for row in body["predictions"]:
        assert len(row["p_values"]) == len(CLASSES)
        above = {CLASSES[k] for k, p in enumerate(row["p_values"]) if p > 0.3 + 1e-6}
        below = {CLASSES[k] for k, p in enumerate(row["p_values"]) if p < 0.3 - 1e-6}
        assert above <= set(row["prediction_set"]) and not below & set(row["prediction_set"])


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"coverage": 1.5}, "coverage"),
        ({"coverage": 0}, "coverage"),
        ({"coverage": "most"}, "coverage"),
        ({"set_method": "topk"}, "set_method"),
        ({"return_p_values": "maybe"}, "return_p_values"),
        ({"randomized": "sometimes"}, "randomized"),
        ({"coverage": 0.81}, "coverage"),  # a level the service does not serve
    ],
)
def test_malformed_set_options_are_a_422_naming_the_field(served, extra, field):
    base_url, _ = served
    response = loopback.post(f"{base_url}/predict", json={"inputs": rows(1)} | extra)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field


def test_an_undeclared_level_is_refused_listing_the_levels_served(served):
    base_url, _ = served
    response = loopback.post(f"{base_url}/predict", json={"inputs": rows(1), "coverage": 0.9000001})
    assert response.status_code == 422 and response.json()["error"]["field"] == "coverage"
    assert "[0.5, 0.7, 0.75, 0.8, 0.85, 0.9]" in response.json()["error"]["message"]
    models = {
        m["name"]: m["versions"][0]["prediction_sets"] for m in loopback.get(f"{base_url}/models").json()["models"]
    }
    assert models["sets"]["levels"] == [0.5, 0.7, 0.75, 0.8, 0.85, 0.9] and models["sets"]["randomized"] is False


def test_a_model_without_conformal_scores_serves_no_sets_and_says_why(served):
    base_url, _ = served
    body = loopback.post(f"{base_url}/predict", json={"model": "plain", "inputs": rows(2)}).json()
    assert body["conformal"] is None and all(p["prediction_set"] is None for p in body["predictions"])
    refused = loopback.post(f"{base_url}/predict", json={"model": "plain", "inputs": rows(2), "coverage": 0.9})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "coverage"
    assert "no conformal scores" in refused.json()["error"]["message"]
    models = {
        m["name"]: m["versions"][0]["prediction_sets"] for m in loopback.get(f"{base_url}/models").json()["models"]
    }
    assert models["plain"]["available"] is False and "no conformal scores" in models["plain"]["reason"]
    assert models["sets"]["available"] is True and models["sets"]["methods"] == ["aps", "lac", "raps"]
    assert (models["sets"]["default_method"], models["sets"]["default_coverage"]) == ("aps", 0.8)


def test_a_tampered_conformal_file_keeps_the_version_from_loading(tmp_path, server_for, linear_artifact, add_conformal):
    directory = linear_artifact(tmp_path / "artifacts", "sets", "1", classes=CLASSES)
    add_conformal(directory)
    (directory / "conformal.json").write_text((directory / "conformal.json").read_text().replace("0.", "0.1", 1))
    settings = Settings(artifacts=tmp_path / "artifacts", store={"url": f"sqlite:///{tmp_path / 'm.db'}"})
    with server_for(settings) as (base_url, _):
        health = loopback.get(f"{base_url}/health").json()
    assert "sha256" in json.dumps(health) and "conformal.json" in json.dumps(health)


def v2_infer(base_url: str, x: np.ndarray, outputs: list[str], parameters: dict | None = None, model="sets"):
    body = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": o} for o in outputs],
    } | ({"parameters": parameters} if parameters else {})
    return loopback.post(f"{base_url}/v2/models/{model}/infer", json=body)


def test_v2_returns_the_sets_and_p_values_named_in_outputs_with_the_threshold_version(served):
    base_url, calibrators = served
    x = np.array(rows(12, seed=4), dtype=np.float32)
    response = v2_infer(
        base_url, x, ["probabilities", "prediction_id", "prediction_set", "conformal_p_values"], {"coverage": 0.9}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    out = {o["name"]: o for o in body["outputs"]}
    assert (out["prediction_set"]["datatype"], out["prediction_set"]["shape"]) == ("BOOL", [12, len(CLASSES)])
    assert (out["conformal_p_values"]["datatype"], out["conformal_p_values"]["shape"]) == ("FP32", [12, len(CLASSES)])
    members = np.array(out["prediction_set"]["data"]).reshape(12, len(CLASSES))
    probs = np.array(out["probabilities"]["data"]).reshape(12, len(CLASSES))
    draws = row_draws(out["prediction_id"]["data"])
    np.testing.assert_array_equal(members, calibrators["floor"]["aps"].sets(probs, 0.1))
    params = body["parameters"]
    assert (params["set_method"], params["coverage"], params["randomized"]) == ("aps", 0.9, False)
    exact = v2_infer(base_url, x, ["probabilities", "prediction_id", "prediction_set"], {"randomized": True}).json()
    out = {o["name"]: o for o in exact["outputs"]}
    members = np.array(out["prediction_set"]["data"]).reshape(12, len(CLASSES))
    draws = row_draws(out["prediction_id"]["data"])
    probs = np.array(out["probabilities"]["data"]).reshape(12, len(CLASSES))
    np.testing.assert_array_equal(members, calibrators["aps"].sets(probs, 0.2, u=draws))
    assert exact["parameters"]["randomized"] is True
    assert params["threshold_version"].endswith(":0")
    plain = v2_infer(base_url, x, ["probabilities"]).json()
    assert [o["name"] for o in plain["outputs"]] == ["probabilities"] and "set_method" not in plain["parameters"]


@pytest.mark.parametrize(
    ("outputs", "parameters", "model", "field"),
    [
        (["prediction_set"], {"coverage": 2}, "sets", "parameters.coverage"),
        (["prediction_set"], {"coverage": True}, "sets", "parameters.coverage"),
        (["prediction_set"], {"set_method": "x"}, "sets", "parameters.set_method"),
        (["prediction_set"], {"coverage": 0.91}, "sets", "parameters.coverage"),
        (["prediction_set"], {"randomized": "yes"}, "sets", "parameters.randomized"),
        (["prediction_set"], None, "plain", "outputs"),
        (["probabilities"], {"coverage": 0.9}, "plain", "parameters.coverage"),
    ],
)
def test_v2_refuses_what_it_cannot_serve_naming_the_field(served, outputs, parameters, model, field):
    base_url, _ = served
    response = v2_infer(base_url, np.zeros((1, 1, 2, 2), dtype=np.float32), outputs, parameters, model)
    assert response.status_code == 400  # the protocol's error: {"error": "<field>: <message>"}
    assert response.json()["error"].startswith(f"{field}: ")


def test_tritonclient_receives_the_prediction_set_as_booleans(served):
    triton = pytest.importorskip("tritonclient.http")
    base_url, calibrators = served
    x = np.array(rows(8, seed=5), dtype=np.float32)
    client = triton.InferenceServerClient(base_url.removeprefix("http://"))
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    wanted = [triton.InferRequestedOutput(name, binary_data=True) for name in ("probabilities", "prediction_set")]
    wanted.append(triton.InferRequestedOutput("prediction_id", binary_data=False))
    result = client.infer("sets", [tensor], outputs=wanted, parameters={"coverage": 0.75, "set_method": "raps"})
    members = result.as_numpy("prediction_set")
    assert members.dtype == bool and members.shape == (8, len(CLASSES))
    assert len(result.as_numpy("prediction_id")) == 8
    expected = calibrators["floor"]["raps"].sets(result.as_numpy("probabilities"), 0.25)
    np.testing.assert_array_equal(members, expected)
    assert result.get_response()["parameters"]["set_method"] == "raps"


def test_grpc_returns_the_prediction_set_as_bool_raw_contents_with_its_parameters(served):
    import grpc

    from service.serving.protocol import grpc_predict_v2_pb2 as pb
    from service.serving.protocol import grpc_predict_v2_pb2_grpc as pb_grpc

    base_url, calibrators = served
    port = loopback.get(f"{base_url}/health").json()["grpc_port"]
    x = np.array(rows(6, seed=6), dtype=np.float32)
    request = pb.ModelInferRequest(model_name="sets")
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    request.parameters["coverage"].double_param = 0.85
    for name in ("probabilities", "prediction_id", "prediction_set"):
        request.outputs.add(name=name)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    out = {o.name: (o, raw) for o, raw in zip(response.outputs, response.raw_output_contents)}
    tensor, raw = out["prediction_set"]
    assert (tensor.datatype, list(tensor.shape)) == ("BOOL", [6, len(CLASSES)])
    members = np.frombuffer(raw, dtype=bool).reshape(6, len(CLASSES))
    probs = np.frombuffer(out["probabilities"][1], dtype="<f4").reshape(6, len(CLASSES))
    ids = response.parameters["prediction_ids"].string_param.split(",")
    np.testing.assert_array_equal(members, calibrators["floor"]["aps"].sets(probs, 0.15))
    assert len(ids) == 6 and response.parameters["coverage"].double_param == 0.85
    assert response.parameters["threshold_version"].string_param.endswith(":0")
    request.parameters["coverage"].double_param = 0.86  # not a level the service serves
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "coverage" in refused.value.details()
