"""GET /dashboard: the self-contained calibration dashboard, rendered in a real headless Chromium.

The browser test drives the default model into the alarm state with offline feedback (calibrated
probabilities, then over-confident ones), opens the page and checks what an operator sees: the red
``alarm`` badge, the ECE in the summary, the rolling-ECE chart, the reliability diagram, no error
message, and a non-blank full-page screenshot. It needs the system Chromium (/usr/bin/chromium) and
the ``playwright`` Python package (no browser download): `make tools` installs Chromium from Debian
and the dev extra installs playwright.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
MODEL = "digits-lenet5"


def _settings(repository_dir: Path, tmp_path: Path) -> Settings:
    return Settings(artifacts=repository_dir, default_model=MODEL, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                    bootstrap_resamples=300, evaluate_seconds=3600, evaluate_every_labels=10**9)


def _offline(z, y, scale: float) -> list[dict]:
    return [{"probabilities": p.tolist(), "label": int(label), "model": MODEL} for p, label in zip(softmax(scale * z), y)]


def _drive_into_alarm(base_url: str, app, evaluate_now) -> dict:
    """400 calibrated labels, then 600 over-confident ones (logits x 2.5), in batches of 100, each
    followed by an alarm evaluation."""
    z, y = calibrated_logits(1000, n_classes=10, logit_scale=8.0, seed=11)
    for start in range(0, 1000, 100):
        scale = 1.0 if start < 400 else 2.5
        r = httpx.post(f"{base_url}/feedback", json={"items": _offline(z[start:start + 100], y[start:start + 100], scale)},
                       timeout=30)
        assert r.status_code == 200 and r.json()["accepted"] == 100, r.text
        evaluate_now(app)
    report = httpx.get(f"{base_url}/calibration", timeout=30).json()
    assert report["alarm"]["state"] == "alarm", report["alarm"]
    return report


def test_dashboard_is_served_as_one_html_page(repository_dir, server_for, tmp_path):
    with server_for(_settings(repository_dir, tmp_path)) as (base_url, _):
        r = httpx.get(f"{base_url}/dashboard")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        html = r.text
        assert "<title>Calibration dashboard</title>" in html
        for element_id in ("alarm-state", "alarm-reasons", "summary", "timeline-chart", "reliability", "error"):
            assert f'id="{element_id}"' in html
        # self-contained: nothing is loaded from another origin
        assert "<script src" not in html and "<link rel=\"stylesheet\"" not in html
        assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
            '"http://www.w3.org/2000/svg"', "")
        assert "https://" not in html
        operation = httpx.get(f"{base_url}/openapi.json").json()["paths"]["/dashboard"]["get"]
        assert "text/html" in operation["responses"]["200"]["content"] and operation["tags"] == ["dashboard"]


def test_dashboard_shows_the_alarm_in_a_real_browser(repository_dir, server_for, tmp_path, evaluate_now):
    from PIL import Image as image_module
    from playwright import sync_api

    assert CHROMIUM.exists(), "the system Chromium is missing: run `make tools` (scripts/install-tools.sh)"

    with server_for(_settings(repository_dir, tmp_path)) as (base_url, app):
        report = _drive_into_alarm(base_url, app, evaluate_now)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1360, "height": 900})
                foreign = []
                page.on("request", lambda request: None if request.url.startswith(base_url) or request.url.startswith(
                    "data:") else foreign.append(request.url))
                console_errors = []
                page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: console_errors.append(str(error)))

                page.goto(f"{base_url}/dashboard", wait_until="domcontentloaded")
                page.wait_for_selector('body[data-loaded="true"]', timeout=20_000)

                badge = page.locator("#alarm-state")
                assert badge.text_content().strip() == "alarm"
                red, green, blue = _rgb(badge.evaluate("e => getComputedStyle(e).backgroundColor"))
                assert red > 150 and green < 100 and blue < 100, (red, green, blue)
                reasons = page.locator("#alarm-reasons li").all_text_contents()
                assert any("e-detector" in reason for reason in reasons), reasons

                summary = page.locator("#summary").text_content()
                assert f"{report['ece']:.4f}" in summary, summary
                assert f"{report['thresholds']['tolerance']:.4f}" in summary

                line_points = page.eval_on_selector(
                    "#timeline-chart", "svg => Array.from(svg.querySelectorAll('polyline, path')).map(e =>"
                    " e.tagName === 'polyline' ? e.getAttribute('points').trim().split(/\\s+/).length"
                    " : (e.getAttribute('d').match(/[ML]/g) || []).length)")
                assert max(line_points) > 1, line_points
                assert page.locator("#timeline-chart .threshold").count() == 0  # the alarm is the e-detector, not an ECE threshold
                assert page.locator("#timeline-chart .band").count() == 1

                reliability = page.locator("#reliability")
                assert reliability.get_attribute("src").startswith("/calibration/reliability.png?")
                assert reliability.evaluate("img => img.naturalWidth") > 0

                assert page.locator("#error").text_content().strip() == ""
                assert page.locator("#alarm-transitions tbody tr").count() >= 1
                assert "up" in page.locator("#health").text_content()

                screenshot = tmp_path / "dashboard.png"
                page.screenshot(path=str(screenshot), full_page=True)
                assert not foreign, foreign
                assert not console_errors, console_errors
            finally:
                browser.close()

    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with image_module.open(screenshot) as image:
        rgb = image.convert("RGB")
        assert rgb.width >= 1000 and rgb.height >= 600, rgb.size
        small = rgb.resize((rgb.width // 2, rgb.height // 2))
        colours = small.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 200, "the screenshot looks blank"
        reds = sum(count for count, (r, g, b) in colours if r > 180 and g < 80 and b < 80)
        assert reds > 500, f"no red alarm badge in the screenshot ({reds} red pixels)"


def _rgb(css: str) -> tuple[int, int, int]:
    """(r, g, b) of a computed CSS colour like ``rgb(209, 36, 47)``."""
    values = css[css.index("(") + 1:css.index(")")].replace("/", " ").replace(",", " ").split()
    return int(float(values[0])), int(float(values[1])), int(float(values[2]))
