"""Regenerate every image of the README into docs/images/.

- ``architecture.png``: the packages and the data path, drawn with matplotlib (no Graphviz);
- ``reliability.png``: the reliability diagram of the committed default artifact
  (``artifacts/digits-lenet5/1/plots/reliability.png``, written by ``python -m training run``), copied;
- ``dashboard.png``: a headless Chromium screenshot of ``GET /dashboard``: ``python -m service`` on a temporary copy
  of ``artifacts/`` with a temporary SQLite store gets in-distribution digits through ``/predict`` and their labels
  through ``/feedback``, then contrast-corrupted digits until the alarm fires.

    .venv/bin/python scripts/readme_images.py [--only architecture reliability dashboard]

Needs the dev extra (matplotlib, Pillow, httpx, the service, scikit-learn's bundled digits) and the system Chromium
for the screenshot (``make tools``). Nothing is downloaded. A PNG over 300 KB is saved with a 256-colour palette.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
OUT = ROOT / "docs" / "images"
MODEL = "digits-lenet5"
RELIABILITY = ROOT / "artifacts" / MODEL / "1" / "plots" / "reliability.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MAX_BYTES = 300_000

# colours per package (fill, edge)
SERVING = ("#dbe8fb", "#2563eb")
MONITORING = ("#ddf3e4", "#1a7f37")
STORE = ("#fdf0d5", "#b7791f")
CALIBKIT = ("#ece4fb", "#6d28d9")
TRAINING = ("#eceff3", "#52606d")
EXTERNAL = ("#ffffff", "#7b8794")


# --------------------------------------------------------------------------------------------------
# architecture.png
# --------------------------------------------------------------------------------------------------


def architecture(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    fig = Figure(figsize=(15, 9.0))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 150)
    ax.set_ylim(0, 90)
    ax.axis("off")

    def box(x, y, w, h, colours, lw=1.6, ls="-", radius=1.2):
        fill, edge = colours
        style = f"round,pad=0,rounding_size={radius}"
        ax.add_patch(
            FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=fill, edgecolor=edge, linewidth=lw, linestyle=ls)
        )

    def arrow(start, end, colour="#3e4c59", lw=1.8, style="-|>", rad=0.0, ls="-"):
        props = dict(arrowstyle=style, color=colour, lw=lw, linestyle=ls, shrinkA=0, shrinkB=0, mutation_scale=16)
        ax.annotate("", xy=end, xytext=start, arrowprops=props | {"connectionstyle": f"arc3,rad={rad}"})

    def mono(x, y, text, size, colour="#1f2933", **style):
        """Text in the monospaced font of package, module and folder names."""
        ax.text(x, y, text, fontsize=size, color=colour, family="DejaVu Sans Mono", **style)

    def package(x, y, w, h, colours, title, subtitle, modules, columns=1):
        box(x, y, w, h, colours)
        mono(x + 1.5, y + h - 2.2, title, 13.5, colours[1], fontweight="bold", va="top")
        ax.text(x + 1.5, y + h - 5.4, subtitle, fontsize=9.5, color="#3e4c59", va="top", style="italic")
        rows = -(-len(modules) // columns)
        col_w = (w - 3) / columns
        for i, (name, what) in enumerate(modules):
            cx = x + 1.5 + (i // rows) * col_w
            cy = y + h - 9.2 - (i % rows) * 3.05
            mono(cx, cy, name, 10, fontweight="bold", va="top")
            ax.text(cx, cy - 1.45, what, fontsize=8.2, color="#52606d", va="top")

    title = "Calibrated model serving: packages and the data path"
    ax.text(2, 87.5, title, fontsize=17, fontweight="bold", va="top", color="#1f2933")

    # ---- the data path ------------------------------------------------------------------------------
    steps = [
        ("predict", "POST /predict, /v2 infer", "http: inference, v2,\ncodec, routes", SERVING),
        ("batch", "dynamic batching", "serving: batching", SERVING),
        ("onnxruntime", "one call per batch", "serving: runtime", SERVING),
        ("calibrated\nprobabilities", "softmax(z / T), ids", "serving: scoring", SERVING),
        ("log", "write-behind rows", "serving: prediction_log", SERVING),
        ("feedback", "POST /feedback labels", "monitoring: labels,\ngroup_commit", MONITORING),
        ("bin sums", "per block of 4,096 labels", "store: labels + block sums", STORE),
        ("alarm", "e-detector, drift test", "monitoring: evaluator,\nalarm; calibkit.detector", MONITORING),
    ]
    x0, width, gap, y, h = 2.0, 15.6, 3.0, 68.0, 11.0
    ax.text(2, 82.6, "data path", fontsize=11, color="#52606d", fontweight="bold", va="center")
    for i, (name, what, where, colours) in enumerate(steps):
        x = x0 + i * (width + gap)
        box(x, y, width, h, colours, lw=2.0, radius=2.0)
        below, size = (4.3, 12.5) if "\n" not in name else (4.9, 11)
        bold = dict(fontweight="bold", color="#1f2933", linespacing=1.0)
        ax.text(x + width / 2, y + h - below, name, ha="center", va="center", fontsize=size, **bold)
        ax.text(x + width / 2, y + 2.3, what, ha="center", va="center", fontsize=8.3, color="#3e4c59")
        mono(x + width / 2, y - 1.2, where, 8.3, colours[1], ha="center", va="top", linespacing=1.1)
        if i:
            arrow((x - gap + 0.15, y + h / 2), (x - 0.15, y + h / 2), lw=2.2)

    # ---- packages -------------------------------------------------------------------------------------
    top, bottom = 58.5, 17.0
    height = top - bottom
    box(24.5, bottom - 1.8, 124.5, height + 4.0, ("#fbfcfd", "#9aa5b1"), lw=1.2, ls="--", radius=1.5)
    service = "service/   python -m service (FastAPI, one worker per process; replicas share the store)"
    mono(26, top + 1.1, service, 9.5, "#52606d", va="center")

    training = [
        ("data", "digits, CIFAR-10, folders"),
        ("models", "LeNet-5, ResNet, WRN, ..."),
        ("losses", "CE, focal, LS, MbLS, ..."),
        ("calibrate", "temperature scaling"),
        ("evaluate", "ECE, NLL, plots, report"),
        ("export", "ONNX + manifest"),
    ]
    package(2, 30, 20, top - 30, TRAINING, "training/", "python -m training run", training)
    box(4.5, bottom - 1.8, 17.5, 10.3, EXTERNAL, lw=1.6)
    mono(5.8, bottom + 6.6, "artifacts/", 13.5, fontweight="bold", va="top")
    files = "<model>/<version>/\nmodel.onnx\n+ manifest.json"
    mono(5.8, bottom + 3.2, files, 8.3, "#3e4c59", va="top", linespacing=1.25)
    arrow((13.25, 30), (13.25, bottom + 8.5), lw=2.0)
    ax.text(14.0, 28.2, "export", fontsize=8.5, color="#52606d", va="center")

    serving = [
        ("http/routes", "every route, declared once"),
        ("http/v2", "Open Inference Protocol"),
        ("http/codec", "JSON in and out"),
        ("dataplane", "request -> batch -> reply"),
        ("batching", "queue, thread per session"),
        ("runtime", "onnxruntime sessions"),
        ("preprocessing", "the manifest's pipeline"),
        ("repository", "loads artifacts/"),
        ("scoring", "ids, probabilities"),
        ("prediction_log", "write-behind queue"),
    ]
    package(26, bottom, 37, height, SERVING, "service/http + serving", "calibrated probabilities, fast", serving, 2)
    mono(27.5, bottom + 2.0, "also GET /models, /health, /metrics, /docs", 8.3, SERVING[1])
    store = [
        ("schema", "tables and indexes"),
        ("migration", "migrated at start"),
        ("predictions", "the prediction log"),
        ("labels + block sums", "bin sums per 4,096 labels"),
        ("calibrations", "refitted temperatures"),
        ("alarm_state", "detector state per version"),
    ]
    package(69, bottom, 30, height, STORE, "service/store", "SQLAlchemy: SQLite or PostgreSQL", store)
    monitoring = [
        ("labels", "join, check, store labels"),
        ("group_commit", "POST /feedback batches"),
        ("evaluator", "background passes"),
        ("alarm", "ok / warning / alarm"),
        ("reports", "ECE, bins, drift"),
        ("calibrations", "recalibrate, activate"),
        ("pending", "labels before predictions"),
        ("webhook", "POSTs transitions"),
    ]
    subtitle = "labels, rolling calibration, the alarm"
    package(105, bottom, 42.5, height, MONITORING, "service/monitoring", subtitle, monitoring, 2)
    mono(106.5, bottom + 2.0, "out: /calibration, /dashboard, /metrics, webhook", 8.3, MONITORING[1])

    # flows between packages
    for start, end, x, y_text, label in (
        ((22, bottom + 3.35), (26, bottom + 3.35), 24, bottom + 4.8, "load"),
        ((63, 31), (69, 31), 66, 32.6, "log rows"),
        ((105, 31), (99, 31), 102, 32.6, "labels"),
        ((99, 25), (105, 25), 102, 26.6, "sums"),
    ):
        arrow(start, end, lw=2.0)
        ax.text(x, y_text, label, fontsize=8.3, color="#52606d", ha="center")

    # ---- calibkit -------------------------------------------------------------------------------------
    box(2, 1.5, 146, 9.5, CALIBKIT)
    mono(3.5, 9.3, "calibkit/", 13.5, CALIBKIT[1], fontweight="bold", va="top")
    imported = "pure numpy + scipy, imported\nby training/ and service/"
    ax.text(3.5, 5.7, imported, fontsize=8.3, color="#3e4c59", va="top", style="italic", linespacing=1.15)
    modules = [
        ("metrics", "ECE, MCE, AdaECE, NLL, Brier"),
        ("binning", "15 bins (lo, hi]"),
        ("stats / BinStats", "mergeable bin sums"),
        ("detector", "CUSUM e-detector"),
        ("alarms", "policy, drift test"),
        ("temperature", "fit and apply T"),
    ]
    for i, (name, what) in enumerate(modules):
        cx = 27 + i * 20.2
        mono(cx, 8.9, name, 10, fontweight="bold", va="top")
        ax.text(cx, 5.6, what, fontsize=8.2, color="#52606d", va="top")
    for x, y_top in ((3.2, 30), (44.5, bottom), (84, bottom), (126, bottom)):
        arrow((x, 11.0), (x, y_top), colour=CALIBKIT[1], lw=1.3, style="<|-", ls=(0, (4, 3)))

    fig.savefig(path, dpi=100, facecolor="white")


# --------------------------------------------------------------------------------------------------
# reliability.png
# --------------------------------------------------------------------------------------------------


def reliability(path: Path) -> None:
    if not RELIABILITY.exists():
        raise SystemExit(f"{RELIABILITY} is missing: run `make artifacts` (python -m training run) first")
    shutil.copyfile(RELIABILITY, path)


# --------------------------------------------------------------------------------------------------
# dashboard.png
# --------------------------------------------------------------------------------------------------


def dashboard(path: Path, start_timeout: float = 120.0) -> None:
    import numpy as np
    from simulate_shift import send_images, serve

    from training.data import corrupt, load_digits_splits

    splits = load_digits_splits()
    x = np.concatenate([splits.val.x, splits.test.x])
    y = np.concatenate([splits.val.y, splits.test.y])
    rng = np.random.default_rng(0)

    workdir = Path(tempfile.mkdtemp(prefix="readme-images-"))
    stack = contextlib.ExitStack()
    try:
        shutil.copytree(ROOT / "artifacts", workdir / "artifacts")
        client = stack.enter_context(
            serve(
                workdir / "artifacts",
                workdir / "monitoring.db",
                workdir / "service.log",
                start_timeout,
                CALIB_DEFAULT_MODEL=MODEL,
                CALIB_MONITORING__EVALUATE_SECONDS="0.2",
                PYTHONPATH=str(ROOT),
            )
        )
        versions = next(m for m in client.get("/models").json()["models"] if m["name"] == MODEL)["versions"]
        version = next(v["version"] for v in versions if v["latest"])

        def send(n: int, shifted: bool) -> None:
            idx = rng.integers(0, len(y), size=n)
            batch = corrupt(x[idx], "contrast", 3, seed=int(rng.integers(1 << 30))) if shifted else x[idx]
            send_images(client, version, batch, y[idx])  # answered once the alarm has seen the labels

        def state() -> str:
            r = client.get("/calibration", params={"model": MODEL, "version": version})
            if r.status_code != 200 or "alarm" not in r.json():
                raise SystemExit(f"GET /calibration answered {r.status_code}: {r.text[:500]}")
            return r.json()["alarm"]["state"]

        labels = 0
        for _ in range(8):  # 800 in-distribution labels
            send(100, shifted=False)
            labels += 100
        print(f"{labels} in-distribution labels: alarm {state()}")
        while labels < 4000:  # contrast severity 3 until the alarm fires
            send(100, shifted=True)
            labels += 100
            if state() == "alarm":
                break
        for _ in range(3):
            send(100, shifted=True)
            labels += 100
        print(f"{labels} labels in all: alarm {state()}")
        time.sleep(1.0)

        shot = workdir / "dashboard.png"
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={workdir / 'chromium'}",
                "--virtual-time-budget=5000",
                "--window-size=1280,1000",
                f"--screenshot={shot}",
                f"{client.base_url}/dashboard?model={MODEL}&version={version}",
            ],
            check=True,
            timeout=180,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _save_small(shot, path)
    except BaseException:
        if (workdir / "service.log").exists():
            print("service log (last lines):\n" + (workdir / "service.log").read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        stack.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _save_small(source: Path, path: Path) -> None:
    """Save ``source`` to ``path`` as an optimised PNG; a 256-colour palette when it would exceed MAX_BYTES."""
    from PIL import Image

    image = Image.open(source).convert("RGB")
    image.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    jobs = {"architecture": architecture, "reliability": reliability, "dashboard": dashboard}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(jobs), default=list(jobs))
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        path = OUT / f"{name}.png"
        jobs[name](path)
        if path.stat().st_size > MAX_BYTES and name != "reliability":
            _save_small(path, path)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
