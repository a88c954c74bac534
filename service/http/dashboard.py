"""GET /dashboard: one self-contained HTML page (inline CSS and vanilla JS) that shows the calibration monitoring of
one model version, refreshed every 5 s from the public JSON endpoints; it holds no state on the server."""

from __future__ import annotations

from importlib import resources

from fastapi.responses import HTMLResponse

#: The page, read once at import (packaged as ``service/static/dashboard.html``).
DASHBOARD_HTML: str = resources.files("service").joinpath("static", "dashboard.html").read_text(encoding="utf-8")


async def dashboard() -> HTMLResponse:
    """Calibration dashboard: alarm state, key metrics, prediction set coverage, rolling ECE, reliability diagram,
    alarm history, health."""
    return HTMLResponse(DASHBOARD_HTML, headers={"Cache-Control": "no-cache"})
