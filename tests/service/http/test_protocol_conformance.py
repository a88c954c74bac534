"""The Open Inference Protocol as its owners' own tools speak it: kserve's InferenceRESTClient and pydantic
models, and MLServer's types, each in its own venv (they pin starlette versions the service's venv does not
take; ``make conformance`` builds them), against the running service. Their probabilities must be the
service's to the bit and their prediction ids must take feedback."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MODEL, SHAPE = "digits-lenet5", (1, 8, 8)
pytestmark = pytest.mark.e2e  # client venvs of their own, built by `make conformance`


def _client(venv: str, script: str, base_url: str) -> dict:
    python = ROOT / venv / "bin" / "python"
    assert python.exists(), f"{venv} is missing: run `make conformance`"
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "conformance" / script), base_url, MODEL, ",".join(map(str, SHAPE))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kserve_rest_client_and_models_accept_every_answer_json_and_binary(
    base_url, rest_probabilities, ids_take_feedback
):
    result = _client(".venv-kserve", "kserve_client.py", base_url)
    expected = rest_probabilities(base_url, MODEL, SHAPE)
    for side in ("json", "binary"):
        np.testing.assert_array_equal(np.asarray(result[side]["probabilities"], np.float32), expected)
        assert result[side]["model_name"] == MODEL and result[side]["id"]  # the id InferRequest made, echoed
        assert len(set(result[side]["ids"])) == 3
        ids_take_feedback(base_url, result[side]["ids"], timeout=5.0)


def test_mlserver_types_accept_every_answer(base_url, rest_probabilities, ids_take_feedback):
    result = _client(".venv-mlserver", "mlserver_types.py", base_url)
    np.testing.assert_array_equal(
        np.asarray(result["probabilities"], np.float32), rest_probabilities(base_url, MODEL, SHAPE)
    )
    assert len(set(result["ids"])) == 3
    ids_take_feedback(base_url, result["ids"], timeout=5.0)


ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
    "additionalProperties": False,
}


def kserve_openapi(schemas: dict) -> dict:
    """The v2 REST routes as an OpenAPI document whose bodies are KServe's own models (``kserve_schemas.py``):
    requests generated from KServe's InferenceRequest, answers held to KServe's response models, and every
    error to the protocol's ``{"error": string}``."""
    ref = lambda name: {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}  # noqa: E731
    errors = {
        str(code): {"description": "error", "content": {"application/json": {"schema": ERROR}}}
        for code in (400, 404, 413, 415, 503)
    }
    model = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": [MODEL, "nope"]}}]

    def get(name: str, parameters=()) -> dict:
        return {
            "get": {
                "parameters": list(parameters),
                "responses": {"200": {"description": "ok", "content": ref(name)}, **errors},
            }
        }

    infer = {
        "post": {
            "parameters": model,
            "requestBody": {"required": True, "content": ref("InferenceRequest")},
            "responses": {"200": {"description": "ok", "content": ref("InferenceResponse")}, **errors},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Open Inference Protocol (KServe's models)", "version": "2"},
        "paths": {
            "/v2": get("ServerMetadataResponse"),
            "/v2/health/live": get("ServerLiveResponse"),
            "/v2/health/ready": get("ServerReadyResponse"),
            "/v2/models/{name}": get("ModelMetadataResponse", model),
            "/v2/models/{name}/ready": get("ModelReadyResponse", model),
            "/v2/models/{name}/infer": infer,
        },
        "components": {"schemas": schemas},
    }


def test_schemathesis_finds_no_answer_that_breaks_kserves_models(base_url):
    import schemathesis

    python = ROOT / ".venv-kserve" / "bin" / "python"
    assert python.exists(), ".venv-kserve is missing: run `make conformance`"
    schemas = json.loads(
        subprocess.run(
            [str(python), str(ROOT / "tests" / "conformance" / "kserve_schemas.py")],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    )
    run_schemathesis(schemathesis.openapi.from_dict(kserve_openapi(schemas)), base_url)


def run_schemathesis(schema, base_url: str, max_examples: int = 30) -> None:
    """Every operation of ``schema``, positive cases and (where there is a body) negative ones, against the
    service: no 5xx, documented statuses and content types, answers that match their schemas, and invalid bodies
    refused."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import load_all_checks, not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    load_all_checks()
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

    def run(operation, mode) -> None:
        extra = [negative_data_rejection] if mode == GenerationMode.NEGATIVE else []

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            case.call_and_validate(base_url=base_url, checks=checks + extra)

        check()

    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations
    for operation in operations:
        for mode in GenerationMode:
            if mode == GenerationMode.POSITIVE or len(operation.body):
                run(operation, mode)


def oip_openapi() -> dict:
    """The protocol's own OpenAPI document (third_party/oip/rest_predict_v2.yaml, KServe's), its ``${MODEL_NAME}``
    and ``${MODEL_VERSION}`` placeholders turned into the path parameters schemathesis fills, with the served
    model and version as their values, and the 404 of an unknown model (negative cases draw other names) added to
    the responses of the paths that name one."""
    spec = yaml.safe_load((ROOT / "third_party" / "oip" / "rest_predict_v2.yaml").read_text())
    values = {"MODEL_NAME": [MODEL], "MODEL_VERSION": ["1"]}
    # the document lists 200 (and 400 for metadata and inference) only; the protocol's text answers a model or version
    # the server does not have with an error object, which servers (KServe, Triton, this one) send as 404
    not_found = {"description": "unknown model or version", "content": {"application/json": {"schema": ERROR}}}
    paths = {}
    for path, item in spec["paths"].items():
        for parameter in item.get("parameters", []):
            parameter["schema"] = {"type": "string", "enum": values[parameter["name"]]}
            for operation in (v for k, v in item.items() if k in ("get", "post")):
                operation["responses"].setdefault("404", not_found)
        paths[path.replace("${MODEL_NAME}", "{MODEL_NAME}").replace("${MODEL_VERSION}", "{MODEL_VERSION}")] = item
    return {**spec, "paths": paths}


def test_schemathesis_holds_the_service_to_the_protocols_own_openapi_document(base_url):
    import schemathesis

    run_schemathesis(schemathesis.openapi.from_dict(oip_openapi()), base_url)
