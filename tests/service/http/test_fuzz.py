"""Fuzzing with schemathesis against the service's own OpenAPI schema, over real HTTP.

For every operation, schemathesis generates requests that follow the schema (positive) and that
break it (negative); the service must never answer 5xx, and every response must match the status
codes, content types and body schemas the schema declares. (schemathesis's pytest plugin does not
run under this pytest, so its strategies are driven with hypothesis directly.)
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from service.app import create_app

load_all_checks()
ALL_CHECKS = CHECKS.get_all()  # server errors, conformance of status, headers, content type and body, acceptance
# of schema-valid data and rejection of schema-invalid data, required headers, methods, auth
# The bodies of these operations carry what no JSON schema can say (an image must decode, probabilities must
# be a distribution over the model's classes, a recalibration window must hold enough labels): a
# schema-valid body may still be refused, with a 422 naming the field. Everywhere else schema-valid input
# must be accepted (or name an unknown model: 404).
SEMANTIC = ["/predict", "/feedback", "/admin/recalibrate", "/admin/calibration/activate"]
# v2 infer too (a tensor's data must fill its shape, its name and datatype must be the model's), answered
# with the protocol's 400.
V2_INFER = ["/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"]
CONFIG = SchemathesisConfig.from_dict(
    {
        "operations": [
            {
                "include-path": path,
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "401", "403", "404", "422" if path in SEMANTIC else "400"]
                    }
                },
            }
            for path in SEMANTIC + V2_INFER
        ]
    }
)
SCHEMA = schemathesis.openapi.from_dict(create_app().openapi(), config=CONFIG)
OPERATIONS = {result.ok().label: result.ok() for result in SCHEMA.get_all_operations()}


def _takes_input(operation) -> bool:
    """Whether schema-invalid input exists (free-form string path parameters have none)."""
    return bool(len(operation.body) or len(operation.query))


# Multipart form fields are strings on the wire: a schema-invalid value of another type cannot be sent as one
# (schemathesis leaves it out, and the request that arrives is valid), so invalid /predict bodies are JSON.
NEGATIVE_MEDIA = {"POST /predict": "application/json"}
CASES = [
    (label, mode)
    for label in sorted(OPERATIONS)
    for mode in GenerationMode
    if mode == GenerationMode.POSITIVE or _takes_input(OPERATIONS[label])
]


@pytest.mark.parametrize("label, mode", CASES, ids=[f"{label}-{mode.value}" for label, mode in CASES])
def test_no_server_errors_and_responses_match_the_schema(base_url, label, mode):
    media = NEGATIVE_MEDIA.get(label) if mode == GenerationMode.NEGATIVE else None

    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        assume(media is None or case.media_type == media)  # as_strategy's media_type is only a preference
        case.call_and_validate(base_url=base_url, checks=ALL_CHECKS)

    check()
