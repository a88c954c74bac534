"""The examples of docs/api.md are the service's own answers for the committed artifact.

Each block between ``<!-- example: NAME -->`` and ``<!-- /example -->`` is rendered from a request sent to the
service serving the committed ``artifacts/digits-lenet5/1`` with default settings: the request as curl, the answer
as JSON, its prediction ids replaced by fixed ones and its floats rounded to 5 significant digits (the last bits of
onnxruntime's kernels differ between CPUs). The test fails when the page differs from what the service answers
now; ``CALIB_UPDATE_DOCS=1 pytest tests/service/http/test_api_examples.py`` rewrites it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "api.md"
DIGIT = [
    [0, 0, 0, 0.125, 1, 1, 0.125, 0],
    [0, 0, 0, 0.25, 1, 1, 0.125, 0],
    [0, 0.0625, 0.25, 0.75, 1, 0.75, 0, 0],
    [0, 0.4375, 1, 1, 1, 0.75, 0, 0],
    [0, 0, 0.1875, 0.625, 1, 0.875, 0, 0],
    [0, 0, 0, 0.5, 1, 0.75, 0, 0],
    [0, 0, 0, 0.375, 1, 1, 0.125, 0],
    [0, 0, 0, 0.125, 0.75, 0.9375, 0.25, 0],
]
#: The ids the page shows, in the order the answers first give them.
SHOWN_IDS = ("01a208a5260abfee7af721be409f0dfc", "01a208a5262451da206c6918a2103b52")
_ID = re.compile(r"\b[0-9a-f]{32}\b")
_BLOCK = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n.*?<!-- /example -->", re.S)


def examples() -> list[tuple[str, str, str, dict]]:
    """(name, method, path, body) of each example, in page order."""
    v2 = {
        "id": "req-1",
        "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": np.ravel(DIGIT).tolist()}],
        "outputs": [{"name": "probabilities"}, {"name": "prediction_id"}, {"name": "prediction_set"}],
    }
    return [
        ("predict", "POST", "/predict", {"top_k": 2, "inputs": [DIGIT]}),
        ("predict-level", "POST", "/predict", {"coverage": 0.99, "inputs": [DIGIT]}),
        ("v2-infer", "POST", "/v2/models/digits-lenet5/infer", v2),
        (
            "feedback",
            "POST",
            "/feedback",
            {
                "items": [
                    {"prediction_id": "{predict}", "label": "1"},
                    {"probabilities": [0.1, 0.9, 0, 0, 0, 0, 0, 0, 0, 0], "label": 7, "model": "digits-lenet5"},
                    {"prediction_id": "nope", "label": 1},
                ]
            },
        ),
    ]


def _short(value):
    """Floats to 5 significant digits, recursively."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, list):
        return [_short(v) for v in value]
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return value


def _json(value, indent: int = 0, prefix: int = 0) -> str:
    """JSON with each object or array on one line when it fits in 116 columns, else one member a line."""
    flat = json.dumps(value)
    if len(flat) + indent + prefix <= 116 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        members = [f"{pad}{json.dumps(k)}: {_json(v, indent + 1, len(k) + 4)}" for k, v in value.items()]
        return "{\n" + ",\n".join(members) + "\n" + " " * indent + "}"
    if not any(isinstance(v, (dict, list)) for v in value):
        return flat
    return "[\n" + ",\n".join(pad + _json(v, indent + 1) for v in value) + "\n" + " " * indent + "]"


def render(client: httpx.Client) -> dict[str, str]:
    """The markdown of each example, from the service behind ``client``."""
    out, ids, made = {}, {}, {}
    for name, method, path, body in examples():
        sent = json.loads(json.dumps(body).replace('"{predict}"', json.dumps(made.get("predict", ""))))
        response = client.request(method, path, json=sent)
        answer = response.json()
        if name == "predict":
            made["predict"] = answer["predictions"][0]["id"]
        text = _json(_short(answer))
        for found in _ID.findall(json.dumps(sent) + text):
            ids.setdefault(found, SHOWN_IDS[len(ids) % len(SHOWN_IDS)])
        shown_body = json.dumps(sent, separators=(", ", ": "))
        for real, shown in ids.items():
            text, shown_body = text.replace(real, shown), shown_body.replace(real, shown)
        status = "" if response.status_code == 200 else f"  # {response.status_code}"
        out[name] = (
            f"<!-- example: {name} -->\n```bash\ncurl -s -X {method} localhost:8000{path} "
            f"-H 'content-type: application/json' \\\n  -d '{shown_body}'{status}\n```\n```json\n{text}\n```\n"
            "<!-- /example -->"
        )
    return out


def test_the_api_page_shows_what_the_service_answers(tmp_path, server_for):
    # the committed version alone: ``make run`` adds later versions of the model to artifacts/
    (tmp_path / "artifacts" / "digits-lenet5").mkdir(parents=True)
    (tmp_path / "artifacts" / "digits-lenet5" / "1").symlink_to(ROOT / "artifacts" / "digits-lenet5" / "1")
    settings = Settings(
        artifacts=tmp_path / "artifacts",
        store={"url": f"sqlite:///{tmp_path / 'm.db'}"},
        prediction_log={"durability": "sync"},
    )
    with server_for(settings) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        rendered = render(client)
    page = PAGE.read_text()
    found = {m.group("name"): m.group(0) for m in _BLOCK.finditer(page)}
    assert sorted(found) == sorted(rendered), "docs/api.md's example markers"
    updated = _BLOCK.sub(lambda m: rendered[m.group("name")], page)
    if os.environ.get("CALIB_UPDATE_DOCS") == "1":
        PAGE.write_text(updated)
    assert updated == page, "docs/api.md is stale: rerun with CALIB_UPDATE_DOCS=1"
    predict = json.loads(rendered["predict"].split("```json\n")[1].split("\n```")[0])
    assert predict["predictions"][0]["prediction_set"] == ["1"] and predict["conformal"]["randomized"] is False


@pytest.mark.parametrize("name", [e[0] for e in examples()])
def test_every_example_has_its_place_on_the_page(name):
    assert f"<!-- example: {name} -->" in PAGE.read_text()
