"""A JSON body's numeric rows straight into one array with simdjson, without a Python object per number. Only a body
that is certainly well formed takes this path, otherwise the general parser answers: it changes speed, never answers.
"""

from __future__ import annotations

import math
import threading
from typing import TypeGuard

import numpy as np
import simdjson

EXACT = 2.0**53  # past this magnitude an integer's float64 may differ from numpy's direct conversion
WORTH_IT_BYTES = 8192
"""Below this body size orjson and numpy are as fast or faster (the measurement: docs/decisions)."""
REUSED_BYTES = 1 << 20
"""Bodies up to this size reuse a parser per thread (its buffers cost as much as parsing); larger ones a new one."""

_local = threading.local()


def _parser(size: int) -> simdjson.Parser:
    if size > REUSED_BYTES:
        return simdjson.Parser()
    if not hasattr(_local, "parser"):
        _local.parser = simdjson.Parser()
    return _local.parser


def numeric_rows(raw: bytes, key: str) -> tuple[dict, np.ndarray] | None:
    """The body's other fields and its ``key`` as a float64 array, or None where it is not certainly well formed.

    >>> fields, rows = numeric_rows(b'{"inputs": [[1, 2.5], [3, 4]], "top_k": 2}', "inputs")
    >>> fields, rows.shape, rows.tolist()
    ({'top_k': 2}, (2, 2), [[1.0, 2.5], [3.0, 4.0]])
    >>> numeric_rows(b'{"inputs": [[1, 2], [3, [4]]]}', "inputs") is None  # ragged: the general path names it
    True
    """
    try:
        document = _parser(len(raw)).parse(raw)  # its arrays and objects all die with this call
        if not isinstance(document, simdjson.Object):
            return None
        names = list(document.keys())
        if key not in names or len(set(names)) != len(names):
            return None
        fields = {name: document[name] for name in names if name != key}
        if any(isinstance(value, (simdjson.Array, simdjson.Object)) for value in fields.values()):
            return None
        rows = document[key]
        shape = _rectangular_shape(rows)
        # every array of that shape holds one "["; any more is an array nested deeper or a bracket in a string
        if shape is None or not isinstance(rows, simdjson.Array) or raw.count(b"[") != _arrays(shape):
            return None
        values = np.frombuffer(rows.as_buffer(of_type="d"), dtype=np.float64)
    except Exception:  # noqa: BLE001 - any simdjson error (invalid JSON or UTF-8, a number out of range, nesting
        # too deep, a value of another type, a parser whose last document is still referenced) only means that
        # the general path answers
        return None
    if values.size != math.prod(shape) or np.abs(values).max() >= EXACT:
        return None
    return fields, values.reshape(shape)


def _rectangular_shape(array) -> tuple[int, ...] | None:
    """The shape of a non-empty nested array whose arrays at each depth have one length (None: ragged)."""
    if not isinstance(array, simdjson.Array):
        return None
    shape, level = [], [array]
    while True:
        length = len(level[0])
        if length == 0 or any(len(a) != length for a in level):
            return None
        shape.append(length)
        if not isinstance(level[0][0], simdjson.Array):
            return tuple(shape)
        children = [child for a in level for child in a]
        if not _all_arrays(children):
            return None
        level = children


def _all_arrays(values: list) -> TypeGuard[list[simdjson.Array]]:
    """Whether every value is a simdjson array."""
    return all(isinstance(value, simdjson.Array) for value in values)


def _arrays(shape: tuple[int, ...]) -> int:
    """How many arrays a nested array of ``shape`` holds, itself included: 1 + n + n*d1 + ..."""
    return sum(math.prod(shape[:depth]) for depth in range(len(shape)))
