"""GET /dashboard: a single self-contained HTML page (inline CSS and vanilla JS, nothing loaded from
elsewhere) that shows the calibration monitoring of one model version and refreshes every 5 s.

The alarm card says what the state of GET /calibration rests on: no labels yet, collecting labels
(fewer than ``thresholds.min_labels`` in the window: an ok is then shown neutral, not as an all-clear),
ok, warning or alarm with their reasons; the card and the ECE tile take the colour of that state.

The prediction sets card shows the coverage block of GET /calibration, one row per set choice served (method and
target coverage): the coverage the labels observed in the window with its Wilson interval against the target, the
mean set size, the served threshold against the static one, and the anytime-valid coverage alarm.

The page only reads the public JSON endpoints (/models, /calibration, /calibration/timeline,
/calibration/history, /calibration/reliability.png, /health); it holds no state on the server.
"""

from __future__ import annotations

from importlib import resources

from fastapi.responses import HTMLResponse

#: The page, read once at import (packaged as ``service/static/dashboard.html``).
DASHBOARD_HTML: str = resources.files("service").joinpath("static", "dashboard.html").read_text(encoding="utf-8")


async def dashboard() -> HTMLResponse:
    """Calibration dashboard: alarm state, key metrics, prediction set coverage, rolling ECE, reliability diagram,
    alarm history, health."""
    return HTMLResponse(DASHBOARD_HTML, headers={"Cache-Control": "no-cache"})
