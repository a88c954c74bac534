"""/predict's numeric JSON path (service.http.numeric_json): where it answers, it gives what orjson and
numpy give; everywhere else it leaves the body to the general path, so that every answer, errors
included, is the same with it and without it."""

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import loopback
from service.http import inference
from service.http.numeric_json import numeric_rows

NUMBERS = st.one_of(st.integers(-(2**60), 2**60), st.floats(allow_nan=False, allow_infinity=False))
LEAVES = st.one_of(NUMBERS, st.booleans(), st.none(), st.text(alphabet='0123456789.e-[]"\\ ', max_size=4))
NESTED = st.recursive(LEAVES, lambda children: st.lists(children, max_size=4), max_leaves=40)
FIELDS = st.dictionaries(
    st.sampled_from(["model", "version", "top_k", "return_logits", "x[", 'q"']),
    st.one_of(LEAVES, st.lists(NUMBERS, max_size=2)),
    max_size=3,
)


def _rectangular(shape: tuple[int, ...]):
    """Nested lists of exactly ``shape`` of numbers below 2**53 in magnitude (beyond, the general path answers)."""
    strategy = st.one_of(st.integers(-(2**53) + 1, 2**53 - 1), st.floats(-1e15, 1e15))
    for size in reversed(shape):
        strategy = st.lists(strategy, min_size=size, max_size=size)
    return strategy


RECTANGULAR = st.lists(st.integers(1, 3), min_size=1, max_size=4).flatmap(lambda shape: _rectangular(tuple(shape)))


def _body(inputs, fields: dict) -> bytes:
    return json.dumps({"inputs": inputs} | {k: v for k, v in fields.items() if k != "inputs"}).encode()


@st.composite
def _nearly_rectangular(draw):
    """A rectangular array of numbers with one entry, at any depth, perhaps replaced by any JSON value."""
    inputs = draw(RECTANGULAR)
    if draw(st.booleans()):
        parent, index = [inputs], 0
        while isinstance(parent[index], list) and parent[index] and draw(st.booleans()):
            parent, index = parent[index], draw(st.integers(0, len(parent[index]) - 1))
        parent[index] = draw(NESTED)
    return inputs


@settings(max_examples=500, deadline=None)
@given(inputs=st.one_of(NESTED, _nearly_rectangular()), fields=FIELDS)
def test_where_it_answers_it_agrees_with_orjson_and_numpy(inputs, fields):
    raw = _body(inputs, fields)
    found = numeric_rows(raw, "inputs")
    if found is None:
        return
    parsed = orjson.loads(raw)
    expected = np.asarray(parsed.pop("inputs"), dtype=np.float64)
    assert expected.dtype.kind == "f" and found[1].shape == expected.shape
    np.testing.assert_array_equal(found[1], expected)
    assert found[0] == parsed


@settings(max_examples=200, deadline=None)
@given(inputs=RECTANGULAR, top_k=st.integers(1, 5))
def test_it_answers_every_rectangular_array_of_numbers(inputs, top_k):
    found = numeric_rows(_body(inputs, {"top_k": top_k, "model": "toy"}), "inputs")
    assert found is not None
    np.testing.assert_array_equal(found[1], np.asarray(inputs, dtype=np.float64))
    assert found[0] == {"top_k": top_k, "model": "toy"}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"inputs": [[1, 2], [3]]}',  # ragged
        b'{"inputs": [[[1, 2], [], 3], [4, 5, 6]]}',  # same lengths and count of numbers, one array deeper
        b'{"inputs": [[1, 2], [3, [4]]]}',
        b'{"inputs": [[1, true], [3, 4]]}',
        b'{"inputs": [[1, "2"], [3, 4]]}',
        b'{"inputs": [[1, null], [3, 4]]}',
        b'{"inputs": [[1, {}], [3, 4]]}',
        b'{"inputs": [[1, 2]], "inputs": [[3, 4]]}',  # a repeated key
        b'{"inputs": [[1, 2]], "model": "a[b"}',  # a bracket in a string
        b'{"inputs": [[1, 2]], "top_k": [1]}',  # another field that is not a scalar
        b'{"inputs": [[1, 2]], "x": {"y": 1}}',
        b'{"inputs": []}',
        b'{"inputs": [[], []]}',
        b'{"inputs": 3}',
        b'{"rows": [[1, 2]]}',
        b"[[1, 2]]",
        b'{"inputs": [[9007199254740993, 1]]}',  # an integer past 2**53
        b'{"inputs": [[1e400, 1]]}',
        b'{"inputs": [[NaN, 1]]}',
        b'{"inputs": [[1, 2]]',
        b"\xff\xfe",
        b'{"inputs": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}",
    ],
)
def test_anything_else_is_left_to_the_general_path(raw):
    assert numeric_rows(raw, "inputs") is None


def _answer(base_url: str, body: bytes) -> tuple[int, dict]:
    """Status and JSON answer of /predict, without what differs between two requests (ids, the randomized sets
    drawn from them, the request id)."""
    response = loopback.post(f"{base_url}/predict", content=body, headers={"Content-Type": "application/json"})
    answer = response.json()
    for prediction in answer.get("predictions", []):
        for varies in ("id", "prediction_set", "set_size"):
            prediction.pop(varies)
    answer.pop("request_id", None)
    return response.status_code, answer


ROW = np.linspace(0, 1, 64).reshape(1, 8, 8).round(3)
BODIES = [
    {"inputs": [ROW.tolist()]},  # (C, H, W)
    {"inputs": [ROW[0].tolist(), (1 - ROW[0]).tolist()], "top_k": 2, "return_logits": True},  # (H, W)
    {"inputs": [ROW.ravel().tolist()], "return_uncalibrated": True},  # flat
    {"inputs": [ROW.tolist()] * 65},  # more rows than allowed
    {"inputs": [ROW[0].tolist(), ROW.ravel().tolist()]},  # two forms in one request
    {"inputs": [ROW[0, :4].tolist()]},  # not the model's shape
    {"inputs": [[[1e39] * 8] * 8]},  # past float32
    {"inputs": [ROW.tolist()], "top_k": 0},
    {"inputs": [ROW.tolist()], "model": "nope"},
    {"inputs": [ROW.tolist()], "colour": "red"},
    {"inputs": [ROW.tolist()], "model": "toy", "version": "1"},
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_predict_answers_the_same_with_and_without_it(server, monkeypatch, body):
    base_url, _ = server
    raw = json.dumps(body).encode()
    monkeypatch.setattr(inference, "WORTH_IT_BYTES", 0)  # these small bodies too
    taken = []
    monkeypatch.setattr(inference, "numeric_rows", lambda raw, key: taken.append(numeric_rows(raw, key)) or taken[-1])
    fast = _answer(base_url, raw)
    # left to the general path: two row forms in one request, numbers past 2**53
    assert (taken[0] is None) == (body is BODIES[4] or body is BODIES[6])
    monkeypatch.setattr(inference, "numeric_rows", lambda raw, key: None)
    assert fast == _answer(base_url, raw)
    assert fast[0] in (200, 404, 422)


def test_a_large_body_takes_it_and_a_small_one_does_not(server, monkeypatch):
    base_url, _ = server
    taken = []
    monkeypatch.setattr(inference, "numeric_rows", lambda raw, key: taken.append(len(raw)) or numeric_rows(raw, key))
    for rows in (1, 32):
        assert _answer(base_url, json.dumps({"inputs": [ROW.tolist()] * rows}).encode())[0] == 200
    assert len(taken) == 1 and taken[0] >= inference.WORTH_IT_BYTES
