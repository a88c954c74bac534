"""Label windows as the API names them: a label count (``1000``) or a duration (``30s``, ``15m``, ``1h``, ``7d``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.errors import InvalidInput
from service.schemas import WINDOW_PATTERN

_WINDOW = re.compile(WINDOW_PATTERN)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Window:
    """A label window: the last ``count`` labels, or the labels of the last ``seconds``."""

    spec: str
    count: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, spec: str) -> Window:
        match = _WINDOW.match(spec.strip()) if isinstance(spec, str) else None
        if match is None:
            raise InvalidInput(
                f"window {spec!r} is neither a label count (e.g. 1000) nor a duration (e.g. 1h, 30m)", field="window"
            )
        count_text, amount, unit = match.groups()
        if count_text:
            return cls(spec, count=int(count_text))
        return cls(spec, seconds=float(amount) * _UNIT_SECONDS[unit])

    def to_dict(self) -> dict:
        return {
            "spec": self.spec,
            "kind": "count" if self.count else "time",
            "labels": self.count,
            "seconds": self.seconds,
        }
