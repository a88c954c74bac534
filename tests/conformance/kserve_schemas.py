"""KServe's own v2 data models (``kserve.protocol.rest.v2_datamodels``) as JSON schemas, for an OpenAPI document
of the protocol as KServe defines it (run in the kserve venv, .venv-kserve).

    .venv-kserve/bin/python tests/conformance/kserve_schemas.py

Prints one JSON object: the schemas by model name, nested definitions included, every reference pointing into
``#/components/schemas``.
"""

import json

from kserve.protocol.rest import v2_datamodels as models

MODELS = [
    "ServerMetadataResponse",
    "ServerLiveResponse",
    "ServerReadyResponse",
    "ModelReadyResponse",
    "ModelMetadataResponse",
    "InferenceRequest",
    "InferenceResponse",
]


def main() -> None:
    schemas = {}
    for name in MODELS:
        schema = getattr(models, name).model_json_schema(ref_template="#/components/schemas/{model}")
        schemas |= schema.pop("$defs", {})
        schemas[name] = schema
    print(json.dumps(schemas))


if __name__ == "__main__":
    main()
