"""Fuzzing with schemathesis against the service's own OpenAPI schema, over real HTTP.

For every operation, schemathesis generates requests that follow the schema (positive) and that
break it (negative); the service must never answer 5xx, and every response must match the status
codes, content types and body schemas the schema declares. (schemathesis's pytest plugin does not
run under this pytest, so its strategies are driven with hypothesis directly.)
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance, status_code_conformance]
SCHEMA = schemathesis.openapi.from_dict(create_app().openapi())
OPERATIONS = {result.ok().label: result.ok() for result in SCHEMA.get_all_operations()}


def _takes_input(operation) -> bool:
    """Whether schema-invalid input exists (free-form string path parameters have none)."""
    return bool(len(operation.body) or len(operation.query))


CASES = [(label, mode) for label in sorted(OPERATIONS) for mode in GenerationMode
         if mode == GenerationMode.POSITIVE or _takes_input(OPERATIONS[label])]


@pytest.mark.parametrize("label, mode", CASES, ids=[f"{label}-{mode.value}" for label, mode in CASES])
def test_no_server_errors_and_responses_match_the_schema(base_url, label, mode):
    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        case.call_and_validate(base_url=base_url, checks=CHECKS)

    check()
