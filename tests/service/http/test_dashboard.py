"""GET /dashboard: the self-contained calibration dashboard, rendered in a real headless Chromium.

The browser test drives the default model into the alarm state with offline feedback (calibrated
probabilities, then over-confident ones), opens the page and checks what an operator sees: the red
``alarm`` badge, the ECE in the summary, the rolling-ECE chart, the reliability diagram, no error
message, and a non-blank full-page screenshot. The state tests reach each alarm state through the
HTTP API (no labels, too few labels, ok, warning from drifted confidences, alarm) and check that the
alarm card says what the state rests on, in colours that agree with it, and the prediction sets card
what the coverage block of /calibration says. It needs the system Chromium
(/usr/bin/chromium) and the ``playwright`` Python package (no browser download): `make tools`
installs Chromium from Debian and the dev extra installs playwright.
"""

from __future__ import annotations

import colorsys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.common import loopback
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax
from service.settings import Settings
from training.data import load_digits_splits

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MODEL = "digits-lenet5"


def _settings(repository_dir: Path, tmp_path: Path, **extra) -> Settings:
    return Settings(
        artifacts=repository_dir,
        default_model=MODEL,
        **extra,
        store={"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
        monitoring={"bootstrap_resamples": 300, "evaluate_seconds": 3600, "evaluate_every_labels": 10**9},
        shift={"settle_seconds": 0},
    )


def _offline(z, y, scale: float) -> list[dict]:
    return [
        {"probabilities": p.tolist(), "label": int(label), "model": MODEL} for p, label in zip(softmax(scale * z), y)
    ]


def _drive_into_alarm(base_url: str, app, evaluate_now) -> dict:
    """400 calibrated labels, then 600 over-confident ones (logits x 2.5), in batches of 100, each
    followed by an alarm evaluation."""
    z, y = calibrated_logits(1000, n_classes=10, logit_scale=8.0, seed=11)
    for start in range(0, 1000, 100):
        scale = 1.0 if start < 400 else 2.5
        r = loopback.post(
            f"{base_url}/feedback",
            json={"items": _offline(z[start : start + 100], y[start : start + 100], scale)},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["accepted"] == 100, r.text
        evaluate_now(app)
    report = loopback.get(f"{base_url}/calibration", timeout=30).json()
    assert report["alarm"]["state"] == "alarm", report["alarm"]
    return report


def test_dashboard_is_served_as_one_html_page(repository_dir, server_for, tmp_path):
    with server_for(_settings(repository_dir, tmp_path)) as (base_url, _):
        r = loopback.get(f"{base_url}/dashboard")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        html = r.text
        assert "<title>Calibration dashboard</title>" in html
        for element_id in (
            "alarm-state",
            "alarm-headline",
            "alarm-reasons",
            "summary",
            "prediction-sets",
            "timeline-chart",
            "reliability",
            "error",
        ):
            assert f'id="{element_id}"' in html
        # self-contained: nothing is loaded from another origin
        assert "<script src" not in html and '<link rel="stylesheet"' not in html
        assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
            '"http://www.w3.org/2000/svg"', ""
        )
        assert "https://" not in html
        operation = loopback.get(f"{base_url}/openapi.json").json()["paths"]["/dashboard"]["get"]
        assert "text/html" in operation["responses"]["200"]["content"] and operation["tags"] == ["dashboard"]


@pytest.fixture(scope="module")
def chromium():
    """The system Chromium, headless, shared by the browser tests of this module."""
    from playwright import sync_api

    assert CHROMIUM.exists(), "the system Chromium is missing: run `make tools` (scripts/install-tools.sh)"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.mark.e2e  # needs Chromium
def test_dashboard_shows_the_alarm_in_a_real_browser(repository_dir, server_for, tmp_path, evaluate_now, chromium):
    from PIL import Image as image_module

    with server_for(_settings(repository_dir, tmp_path)) as (base_url, app):
        report = _drive_into_alarm(base_url, app, evaluate_now)
        page = chromium.new_page(viewport={"width": 1360, "height": 900})
        try:
            foreign = []
            page.on(
                "request",
                lambda request: (
                    None
                    if request.url.startswith(base_url) or request.url.startswith("data:")
                    else foreign.append(request.url)
                ),
            )
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
                "#timeline-chart",
                "svg => Array.from(svg.querySelectorAll('polyline, path')).map(e =>"
                " e.tagName === 'polyline' ? e.getAttribute('points').trim().split(/\\s+/).length"
                " : (e.getAttribute('d').match(/[ML]/g) || []).length)",
            )
            assert max(line_points) > 1, line_points
            assert (
                page.locator("#timeline-chart .threshold").count() == 0
            )  # the alarm is the e-detector, not an ECE threshold
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
            page.close()

    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with image_module.open(screenshot) as image:
        rgb = image.convert("RGB")
        assert rgb.width >= 1000 and rgb.height >= 600, rgb.size
        small = rgb.resize((rgb.width // 2, rgb.height // 2))
        colours = small.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 200, "the screenshot looks blank"
        reds = sum(count for count, (r, g, b) in colours if r > 180 and g < 80 and b < 80)
        assert reds > 500, f"no red alarm badge in the screenshot ({reds} red pixels)"


DIGITS = load_digits_splits().test


def _predict_and_label(base_url: str, x: np.ndarray, y: np.ndarray) -> None:
    """POST /predict the digits, then POST /feedback their true labels by prediction id."""
    r = loopback.post(f"{base_url}/predict", json={"inputs": x.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    items = [{"prediction_id": p["id"], "label": int(label)} for p, label in zip(r.json()["predictions"], y)]
    r = loopback.post(f"{base_url}/feedback", json={"items": items}, timeout=30)
    assert r.status_code == 200 and r.json()["accepted"] == len(items), r.text


def _no_labels(base_url: str, app, evaluate_now) -> None:
    evaluate_now(app)


def _too_few_labels(base_url: str, app, evaluate_now) -> None:
    _predict_and_label(base_url, DIGITS.x[:62], DIGITS.y[:62])
    evaluate_now(app)


def _enough_labels(base_url: str, app, evaluate_now) -> None:
    _predict_and_label(base_url, DIGITS.x, DIGITS.y)
    evaluate_now(app)


def _drifted_confidences(base_url: str, app, evaluate_now) -> None:
    """Enough labels, then 300 unlabelled predictions of noisy digits: their confidences drift from
    the reference (the label-free KS test of the warning)."""
    _enough_labels(base_url, app, evaluate_now)
    noisy = np.clip(DIGITS.x[:300] + np.random.default_rng(0).normal(0.0, 0.5, DIGITS.x[:300].shape), 0.0, 1.0)
    r = loopback.post(f"{base_url}/predict", json={"inputs": noisy.astype(np.float32).tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    logged = min(len(DIGITS.y) + 300, app.state.parts.settings.monitoring.drift_rows)
    deadline = time.monotonic() + 30
    while loopback.get(f"{base_url}/calibration", timeout=30).json()["drift"]["recent_predictions"] < logged:
        assert time.monotonic() < deadline, "the unlabelled predictions were not logged"
        time.sleep(0.2)
    evaluate_now(app)


def _alarm(base_url: str, app, evaluate_now) -> None:
    _drive_into_alarm(base_url, app, evaluate_now)


#: state -> (how to reach it, API alarm state, badge, headline start, tone of its colours)
STATES = {
    "no-labels": (_no_labels, "ok", "no labels", "No labels yet: send POST /feedback", "neutral"),
    "too-few-labels": (_too_few_labels, "ok", "collecting", "Collecting labels: 62 of 200", "neutral"),
    "ok": (
        _enough_labels,
        "ok",
        "ok",
        "Calibration ok: no evidence of miscalibration beyond the tolerance (0.01)",
        "green",
    ),
    "warning": (_drifted_confidences, "warning", "warning", "Warning: confidences drifted from the reference", "amber"),
    "alarm": (_alarm, "alarm", "alarm", "Alarm: miscalibration beyond the tolerance (0.01)", "red"),
}

STYLES = """() => {
  const style = (selector, property) => getComputedStyle(document.querySelector(selector))[property];
  return {
    badge: style("#alarm-state", "backgroundColor"),
    card: style("#state-card", "borderTopColor"),
    headline_border: style("#alarm-headline", "borderLeftColor"),
    headline_background: style("#alarm-headline", "backgroundColor"),
    ece_background: style('[data-metric="ece"]', "backgroundColor"),
    ece_value: style('[data-metric="ece"] .value', "color"),
  };
}"""


@pytest.mark.e2e  # needs Chromium
@pytest.mark.parametrize("name", list(STATES))
def test_dashboard_says_what_the_alarm_state_rests_on(
    name, repository_dir, server_for, tmp_path, evaluate_now, chromium
):
    """Each state reached through the API: the alarm card's text and colours agree with it."""
    from PIL import Image as image_module

    drive, api_state, badge_text, headline, tone = STATES[name]
    with server_for(_settings(repository_dir, tmp_path)) as (base_url, app):
        drive(base_url, app, evaluate_now)
        report = loopback.get(f"{base_url}/calibration", timeout=30).json()
        assert report["alarm"]["state"] == api_state, report["alarm"]
        assert report["thresholds"]["min_labels"] == 200
        page, console_errors = _open_dashboard(chromium, base_url)
        try:
            assert page.locator("#alarm-state").text_content().strip() == badge_text
            assert page.locator("#alarm-state").get_attribute("data-state") == api_state
            assert page.locator("#alarm-headline").text_content().strip().startswith(headline)
            reasons = page.locator("#alarm-reasons li").all_text_contents()
            assert "Nothing to report" not in page.locator("body").inner_text()
            det = report["e_detector"]  # the lag: what the state rests on against what is stored
            assert any(
                r.startswith(f"The alarm state rests on {det['labels_seen']} label")
                and f"folded of {det['labels_stored']} label" in r
                for r in reasons
            ), reasons
            styles = page.evaluate(STYLES)
            assert {key: _tone(value) for key, value in styles.items()} == dict.fromkeys(styles, tone), styles
            assert page.locator("#error").text_content().strip() == ""

            if name == "no-labels":
                assert report["n"] == 0
                assert report["coverage"]["available"] and report["coverage"]["choices"] == []
                assert "No labelled prediction sets yet" in page.locator("#prediction-sets").text_content()
                assert any("Calibration is unchecked" in reason for reason in reasons), reasons
                assert "no labels yet" in page.locator('[data-metric="ece"]').text_content()
            elif name == "too-few-labels":
                assert report["n"] == 62
                assert any("138 more labels needed" in reason for reason in reasons), reasons
                assert "provisional: min 200" in page.locator('[data-metric="n"] .sub').text_content()
                assert "provisional" in page.locator('[data-metric="ece"] .label').text_content()
            elif name == "ok":
                assert report["n"] >= 200
                assert any(reason.startswith("E-detector") for reason in reasons), reasons
                est = report["drift"]["estimated"]  # the label-free estimate, with the labels' check beside it
                line = next(r for r in reasons if r.startswith("Before labels: estimated accuracy"))
                assert f"{100 * est['accuracy']['estimate']:.1f}%" in line and "realized" in line, line
                shift = report["label_shift"]  # the predictions folded at once (settle_seconds 0)
                assert shift["state"] == "ok" and shift["predictions"] == len(DIGITS.y)
                assert any(r.startswith(f"Label-shift alarm ok on {len(DIGITS.y)} predictions") for r in reasons)
                (choice,) = report["coverage"]["choices"]  # the default set choice, served with each prediction
                assert choice["n"] == report["n"] and choice["alarm"]["state"] == "ok"
                row = _sets_row(page, choice)
                assert row.get_attribute("data-alarm") == "ok" and "below target" not in row.text_content()
            elif name == "warning":
                assert report["n"] >= 200
                assert report["alarm"]["reasons"][0].startswith("confidence distribution shifted")
                assert report["alarm"]["reasons"][0] in reasons
            else:
                assert any("e-detector reached" in reason for reason in reasons), reasons

            card_shot = tmp_path / f"dashboard-{name}-state.png"
            page.locator("#state-card").screenshot(path=str(card_shot))
            summary_shot = tmp_path / f"dashboard-{name}-summary.png"
            page.locator("#summary-card").screenshot(path=str(summary_shot))
            page.screenshot(path=str(tmp_path / f"dashboard-{name}.png"), full_page=True)
            assert not console_errors, console_errors
        finally:
            page.close()

    badge = _rgb(styles["badge"])
    with image_module.open(card_shot) as image:
        pixels = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert sum(count for count, rgb in pixels if max(abs(a - b) for a, b in zip(rgb, badge)) <= 3) > 3000, (
        "the badge colour is missing from the screenshot of the alarm card"
    )
    if tone != "red":
        for shot in (card_shot, summary_shot):
            with image_module.open(shot) as image:
                pixels = image.convert("RGB").getcolors(maxcolors=1 << 20)
            reds = sum(count for count, (r, g, b) in pixels if r > 180 and g < 80 and b < 80)
            assert reds == 0, f"{reds} red pixels in {shot.name} while the state is {name}"


def _threshold(value: float | None) -> str:
    """A threshold as the card shows it: +inf (the full set, null in the block) as the infinity sign."""
    return "∞" if value is None else f"{value:.4f}"


def _sets_row(page, choice: dict):
    """The prediction sets card's row of a set choice of the coverage block, checked against the block: the observed
    coverage with its interval, the target and n, the mean set size, the threshold against the static one."""
    rule = "/exact" if choice["randomized"] else ""
    row = page.locator(f'#prediction-sets tr[data-choice="{choice["method"]}@{choice["coverage"]}{rule}"]')
    assert row.count() == 1, page.locator("#prediction-sets").inner_html()
    text = row.text_content()
    low, high = choice["interval"]
    for expected in (
        f"{choice['method']} @ {100 * choice['coverage']:.1f}%",
        f"{100 * choice['observed']:.1f}% [{100 * low:.1f}%, {100 * high:.1f}%]",
        f"target {100 * choice['coverage']:.1f}% · n = {choice['n']}",
        f"{choice['mean_set_size']:.2f}",
        f"{_threshold(choice['threshold'])} (static {_threshold(choice['static_threshold'])})",
        f"{choice['labels_folded']} labels folded",
        "exact (randomized) sets" if choice["randomized"] else "floor sets",
    ):
        assert expected in text, (expected, text)
    return row


@pytest.mark.e2e  # needs Chromium
def test_dashboard_shows_the_prediction_sets_coverage_alarm(
    repository_dir, server_for, tmp_path, evaluate_now, chromium
):
    """Labels outside the served sets (each prediction's least probable digit): the coverage alarm is raised and the
    prediction sets card shows it, with the observed coverage below its target."""
    with server_for(_settings(repository_dir, tmp_path, conformal={"alarm_threshold": 200.0})) as (base_url, app):
        r = loopback.post(f"{base_url}/predict", json={"inputs": DIGITS.x.tolist()}, timeout=30)
        assert r.status_code == 200, r.text
        items = [
            {"prediction_id": p["id"], "label": int(np.argmin(p["probabilities"]))} for p in r.json()["predictions"]
        ]
        r = loopback.post(f"{base_url}/feedback", json={"items": items}, timeout=30)
        assert r.status_code == 200 and r.json()["accepted"] == len(items), r.text
        evaluate_now(app)
        block = loopback.get(f"{base_url}/calibration", timeout=30).json()["coverage"]
        (choice,) = block["choices"]
        assert choice["alarm"]["state"] == "alarm" and choice["below_target"], choice
        assert choice["labels_folded"] == len(items) and choice["threshold"] != choice["static_threshold"]
        page, console_errors = _open_dashboard(chromium, base_url)
        try:
            row = _sets_row(page, choice)
            assert row.get_attribute("data-alarm") == "alarm"
            assert row.locator(".pill").text_content() == "alarm"
            assert "below target" in row.locator("td.bad").text_content()
            assert "since " in row.text_content()
            assert "alarm at 200" in page.locator("#sets-hint").text_content()
            assert "n / 200" in page.locator("#prediction-sets .note").text_content()
            assert page.locator("#error").text_content().strip() == ""
            assert not console_errors, console_errors
        finally:
            page.close()


def _open_dashboard(chromium, base_url: str):
    """(page, the console errors it logs) of /dashboard once loaded."""
    page = chromium.new_page(viewport={"width": 1360, "height": 900})
    console_errors: list[str] = []
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: console_errors.append(str(error)))
    page.goto(f"{base_url}/dashboard", wait_until="domcontentloaded")
    page.wait_for_selector('body[data-loaded="true"]', timeout=20_000)
    return page, console_errors


def _tone(css: str) -> str:
    """``red``, ``amber``, ``green`` or ``neutral`` (grey, bluish grey, near white) for a computed CSS colour."""
    hue, saturation, _ = colorsys.rgb_to_hsv(*(channel / 255 for channel in _rgb(css)))
    hue *= 360
    if saturation < 0.03 or (180 <= hue < 260 and saturation < 0.3):
        return "neutral"
    if hue >= 340 or hue < 15:
        return "red"
    if hue < 50:
        return "amber"
    if 90 <= hue < 160:
        return "green"
    return f"other ({css})"


def _rgb(css: str) -> tuple[int, int, int]:
    """(r, g, b) of a computed CSS colour like ``rgb(209, 36, 47)``."""
    values = css[css.index("(") + 1 : css.index(")")].replace("/", " ").replace(",", " ").split()
    return int(float(values[0])), int(float(values[1])), int(float(values[2]))
