"""Demo: watch calibration break under dataset shift, the alarm fire, and recalibration fix it.

Starts the service on the default artifact (fresh SQLite store), then through the HTTP API:
1. in-distribution digits with labels: rolling ECE stays low, alarm ok;
2. contrast-corrupted digits (Hendrycks & Dietterich, severity 3): the model turns under-confident, rolling ECE
   rises and the alarm fires;
3. once the window holds only shifted labels, POST /admin/recalibrate applies the temperature refitted on them (a
   window that still mixes the old distribution would fit neither);
4. more corrupted digits: ECE is back down under the new calibration version.
Prints a table as it goes and plots rolling ECE to runs/demo/rolling_ece.png.

    python scripts/demo.py [--out-dir runs/demo]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulate_shift import ARTIFACT, MODEL, ROOT, send_images, serve  # noqa: E402

from training.data import corrupt, load_digits_splits  # noqa: E402

TOKEN = "demo-token"
BATCH = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "runs" / "demo", help="where the plot is written")
    args = parser.parse_args()
    splits = load_digits_splits()
    x = np.concatenate([splits.val.x, splits.test.x])
    y = np.concatenate([splits.val.y, splits.test.y])
    rng = np.random.default_rng(0)
    history: list[dict] = []
    labels = 0

    def stream(phase: str, n: int, shifted: bool, stop_on_alarm: bool = False) -> None:
        nonlocal labels
        for _ in range(n // BATCH):
            idx = rng.integers(0, len(y), size=BATCH)
            batch = corrupt(x[idx], "contrast", 3, seed=int(rng.integers(1 << 30))) if shifted else x[idx]
            send_images(client, "1", batch, y[idx])
            labels += BATCH
            report = client.get("/calibration", params={"window": "300"}).json()
            row = {
                "labels": labels,
                "phase": phase,
                "ece": report["ece"],
                "ci": report["ece_ci"],
                "state": report["alarm"]["state"],
                "calibration_version": report["calibration_version"],
            }
            history.append(row)
            print(
                f"{labels:>6} {phase:<22} v{row['calibration_version']} ECE {row['ece']:.3f} "
                f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}] alarm: {row['state']}",
                flush=True,
            )
            if stop_on_alarm and row["state"] == "alarm":
                return

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="calib-demo-")))
        shutil.copytree(ARTIFACT, workdir / "artifacts" / MODEL / "1")
        tokens = {"CALIB_AUTH__ADMIN_TOKENS": f"admin:{TOKEN}"}
        client = stack.enter_context(serve(workdir / "artifacts", workdir / "store.db", **tokens))
        print(f"{'labels':>6} {'phase':<22} rolling ECE (last 300 labels) and alarm")
        stream("in-distribution", 600, shifted=False)
        stream("contrast severity 3", 1500, shifted=True, stop_on_alarm=True)
        stream("collecting shifted labels", 300, shifted=True)
        refit = client.post(
            "/admin/recalibrate", json={"window": "300"}, headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        print(
            f"\nrecalibrated: temperature {refit['temperature']:.3f} as calibration version "
            f"{refit['calibration_version']} (window ECE {refit['ece_current']:.3f} -> {refit['ece_after']:.3f} "
            f"in-sample)\n"
        )
        stream("after recalibration", 600, shifted=True)
        plot(history, args.out_dir / "rolling_ece.png")


def plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    n = [h["labels"] for h in history]
    ax.fill_between(n, [h["ci"][0] for h in history], [h["ci"][1] for h in history], alpha=0.25, label="90% interval")
    ax.plot(n, [h["ece"] for h in history], marker="o", label="rolling ECE (300 labels)")
    top = max(h["ci"][1] for h in history)
    for k, phase in enumerate(dict.fromkeys(h["phase"] for h in history)):
        start = next(h["labels"] for h in history if h["phase"] == phase) - BATCH
        ax.axvline(start, color="grey", linestyle=":")
        ax.text(start, top * (1.32 - 0.08 * k), f" {phase}", fontsize=8, va="top")
    ax.set_ylim(0, top * 1.35)
    alarms = [h["labels"] for h in history if h["state"] == "alarm"]
    if alarms:
        ax.axvline(alarms[0], color="red", label="alarm raised")
    ax.set(xlabel="labelled predictions", ylabel="ECE", title="Calibration of digits-lenet5 under shift")
    ax.legend(loc="center right", fontsize=8)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
