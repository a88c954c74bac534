"""The prediction sets end to end, as users meet them: the service serving the digits model and a CIFAR-like model,
each label sent ``delay`` predictions after its prediction; coverage, set size and empty sets of the sets received.

Exchangeable streams resample the digits test split and fresh CIFAR-like traffic. Shift streams then shift (digits: a
corruption; CIFAR-like: logits times ``OVER_CONFIDENT``), measured from when the first shifted labels reach the
tracker, against an oracle: the floor sets calibrated on the shifted pool at the coverage reached. ``alarm_streams``:
the alarm in process.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import CIFAR_LIKE, ROOT, digits_model, many, progress, service, table
from calibkit.conformal import SplitConformal, conformity_scores

DELAYS = (0, 100, 1_000, 10_000)
ROWS, BATCH, WINDOW = 50, 200, 1_000
#: 20 windows a stream: the 99% share of a data set and delay is judged on 100 windows, where one may fall short.
MEASURED = 20_000
SHIFT_BEFORE, SHIFT_MIN = 2_000, 8_000
CIFAR_NAME, CIFAR_SIDE, CIFAR_SCALE = "cifar-like", 4, 100.0  # logits = 100 (x - 0.5), x the first 10 of 16
OVER_CONFIDENT = 2.5
DIGITS_SHIFT = ("contrast", 5)
ALARM_STREAMS, ALARM_LABELS = 200, 10_000
STREAM_COLUMNS = (
    "data kind delay stream predictions coverage worst_window windows_ok mean_size static_size reference_size "
    "empty alarm folded"
).split()


def cifar_artifact(root: Path, seed: int) -> None:
    """A CIFAR-like model exported as training exports one: logits 100 (x - 0.5) of the first 10 of its 16 inputs."""
    import torch

    from calibkit.calibrators import TemperatureScaling
    from training.conformal import calibration_split
    from training.data import DataSplits, ImageDataset
    from training.evaluation import before_after
    from training.export import write_artifact

    class Logits(torch.nn.Module):
        def forward(self, x):
            return (x.flatten(1)[:, : CIFAR_LIKE.n_classes] - 0.5) * CIFAR_SCALE

    rng = np.random.default_rng(seed)
    names = tuple(str(k) for k in range(CIFAR_LIKE.n_classes))

    def part(n: int) -> ImageDataset:
        z, y = CIFAR_LIKE.logits(rng, (n,))
        return ImageDataset(np.clip(embed(z), 0.0, 1.0), y, names)

    splits = DataSplits(part(64), part(2_000), part(64), CIFAR_NAME)
    split = calibration_split(splits.val.y, 0.5, seed)
    logits = (
        splits.val.x.reshape(len(splits.val.y), -1)[:, : CIFAR_LIKE.n_classes].astype(np.float64) - 0.5
    ) * CIFAR_SCALE
    calibrator = TemperatureScaling().fit(logits[split.temperature], splits.val.y[split.temperature])
    write_artifact(
        model=Logits().eval(),
        calibrator=calibrator,
        class_names=names,
        input_shape=(1, CIFAR_SIDE, CIFAR_SIDE),
        val_x=splits.val.x,
        val_y=splits.val.y,
        evaluation={"validation": before_after(logits, splits.val.y, calibrator, 20, 15)},
        training_info=None,
        root=root,
        name=CIFAR_NAME,
        version="1",
        split=split,
    )


def embed(z: np.ndarray) -> np.ndarray:
    """Logits (N, 10) as the CIFAR-like model's input (N, 1, 4, 4): 0.5 + z / 100, padded with 0.5."""
    x = np.full((len(z), CIFAR_SIDE * CIFAR_SIDE), 0.5, dtype=np.float32)
    x[:, : z.shape[1]] = 0.5 + z / CIFAR_SCALE
    return x.reshape(len(z), 1, CIFAR_SIDE, CIFAR_SIDE)


def pools(seed: int) -> dict:
    """Per data set: the model, the exchangeable pool and the shifted pool (inputs, labels)."""
    from training.data import corrupt, load_digits_splits

    rng = np.random.default_rng(seed)
    test = load_digits_splits().test
    kind, severity = DIGITS_SHIFT
    shifted = np.concatenate([corrupt(test.x, kind, severity, seed=s) for s in range(4)])
    z, y = CIFAR_LIKE.logits(rng, (50_000,))
    z_shift, y_shift = CIFAR_LIKE.logits(rng, (50_000,))
    return {
        "digits": ("digits-lenet5", (test.x, test.y), (shifted, np.tile(test.y, 4)), f"{kind} {severity}"),
        CIFAR_NAME: (CIFAR_NAME, (embed(z), y), (embed(OVER_CONFIDENT * z_shift), y_shift), "temperature / 2.5"),
    }


def stream(url: str, model: str, x: np.ndarray, y: np.ndarray, delay: int) -> dict:
    """Serve the rows in order, each label sent ``delay`` predictions later: what the client received."""
    hits, sizes, probs = [], [], []
    ids: list[str] = []
    sent = 0
    with httpx.Client(base_url=url, timeout=60) as client:

        def send(upto: int) -> None:
            nonlocal sent
            while upto - sent >= BATCH or (upto == len(ids) == len(y) and sent < upto):
                items = [{"prediction_id": i, "label": int(k)} for i, k in zip(ids[sent : sent + BATCH], y[sent:])]
                response = client.post("/feedback", json={"items": items})
                response.raise_for_status()
                sent += len(items)

        for start in range(0, len(y), ROWS):
            rows = slice(start, min(start + ROWS, len(y)))
            body = client.post("/predict", json={"model": model, "inputs": x[rows].tolist()})
            body.raise_for_status()
            for p, label in zip(body.json()["predictions"], y[rows]):
                members = p["prediction_set"]
                hits.append(str(label) in members)
                sizes.append(len(members))
                probs.append(p["probabilities"])
                ids.append(p["id"])
            send(max(0, len(ids) - delay))
        time.sleep(2.5)  # the evaluator folds what came last
        block = client.get("/calibration", params={"model": model, "window": "1000000"}).json()["coverage"]
    choice = next(c for c in block["choices"] if not c["randomized"])
    return {
        "hits": np.array(hits),
        "sizes": np.array(sizes),
        "probs": np.array(probs),
        "alarm": choice["alarm"]["state"],
        "folded": choice["labels_folded"],
    }


def floor_calibrator(artifacts: Path, model: str) -> tuple[SplitConformal, float]:
    """The served default method's floor calibrator and the default coverage of a model's artifact."""
    from calibkit.manifest import load_conformal, load_manifest

    directory = artifacts / model / "1"
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.conformal is not None
    floors = load_conformal(directory, manifest.conformal, manifest.class_names, floor=True)
    assert floors is not None
    return floors[manifest.conformal.default_method], manifest.conformal.default_coverage


def run(
    seed: int,
    streams: int,
    shift_streams: int,
    delays=DELAYS,
    measured: int = MEASURED,
    shift_min: int = SHIFT_MIN,
    alarm: int = ALARM_STREAMS,
) -> dict:
    """Every stream over HTTP, and the alarm streams; per stream from the delay's end, coverage, the worst ``WINDOW``
    and the share of windows at the target less 3 points or above, and mean set size against the floor sets'."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts"
        (artifacts / "digits-lenet5").mkdir(parents=True)
        (artifacts / "digits-lenet5" / "1").symlink_to(ROOT / "artifacts" / "digits-lenet5" / "1")
        cifar_artifact(artifacts, seed)
        print(table([], STREAM_COLUMNS), flush=True)
        for data, (model, (x, y), (xs, ys), shift_name) in pools(seed).items():
            calibrator, coverage = floor_calibrator(artifacts, model)
            q = calibrator.quantile(1 - coverage)
            # the served (graph) probabilities of the shifted pool, for the shifted streams' oracle
            served_xs = digits_model(artifact=artifacts / model / "1")(xs)
            for delay, index in itertools.product(delays, range(streams + shift_streams)):
                shifted = index >= streams
                length = (SHIFT_BEFORE + delay + max(20 * delay, shift_min)) if shifted else delay + measured
                pick = rng.integers(0, len(y), length)
                sx, sy = x[pick], y[pick]
                if shifted:
                    after = rng.integers(0, len(ys), length - SHIFT_BEFORE)
                    sx = np.concatenate([sx[:SHIFT_BEFORE], xs[after]])
                    sy = np.concatenate([sy[:SHIFT_BEFORE], ys[after]])
                with service(artifacts, f"sqlite:///{tmp}/{data}-{delay}-{index}.db") as server:
                    got = stream(server.url, model, sx, sy, delay)
                start = SHIFT_BEFORE + delay if shifted else delay
                hits, sizes = got["hits"][start:], got["sizes"][start:]
                static = float(calibrator.sets(got["probs"][start:], 1 - coverage).sum(axis=1).mean())
                oracle = static
                if shifted:  # an oracle calibrated on the served probabilities of the shifted pool
                    oracle = oracle_size(served_xs, ys, calibrator, hits.mean())
                n = len(hits) // WINDOW * WINDOW
                windows = hits[:n].reshape(-1, WINDOW).mean(axis=1) if n else np.array([hits.mean()])
                row = {
                    "data": data,
                    "kind": "shift" if shifted else "exchangeable",
                    "delay": delay,
                    "stream": index,
                    "predictions": len(hits),
                    "coverage": float(hits.mean()),
                    "worst_window": float(windows.min()),
                    "windows_ok": float((windows >= coverage - 0.03).mean()),
                    "mean_size": float(sizes.mean()),
                    "static_size": static,
                    "reference_size": float(oracle),
                    "empty": int((got["sizes"] == 0).sum()),
                    "alarm": got["alarm"],
                    "folded": got["folded"],
                    "threshold": q,
                    "shift": shift_name if shifted else "",
                }
                rows.append(progress(row, STREAM_COLUMNS))
    about = {
        "delays": list(delays),
        "rows_per_request": ROWS,
        "labels_per_feedback": BATCH,
        "window": WINDOW,
        "measured": measured,
        "streams": streams,
        "shift_streams": shift_streams,
        "shift_before": SHIFT_BEFORE,
        "shift_min": shift_min,
        "digits_shift": " ".join(map(str, DIGITS_SHIFT)),
        "cifar_shift": f"logits x {OVER_CONFIDENT}",
        "alarm_streams": alarm,
        "alarm_labels": ALARM_LABELS,
    }
    return {"streams": rows, "alarm": alarm_streams(seed + 1, alarm), "setup": about}


def oracle_size(probs: np.ndarray, labels: np.ndarray, calibrator: SplitConformal, coverage: float) -> float:
    """The mean floor set size of split conformal calibrated on the shifted pool itself, at ``coverage``."""
    params: dict[str, Any] = {"k_reg": calibrator.k_reg, "lam": calibrator.lam} if calibrator.method == "raps" else {}
    oracle = SplitConformal.fit(probs, labels, calibrator.method, floor=True, **params)
    alpha = min(max(1 - coverage, 1e-6), 1 - 1e-6)
    return float(oracle.sets(probs, alpha).sum(axis=1).mean())


def alarm_streams(seed: int, count: int = ALARM_STREAMS) -> dict:
    """Exchangeable CIFAR-like streams through the service's own fold: those raised, against n / A + 0.01."""
    from calibkit.conformal import pick_k_reg
    from calibkit.conformal.adaptive import DEFAULT_STEP, LogQuantileTracker
    from calibkit.coverage_alarm import (
        DEFAULT_THRESHOLD,
        CoverageAlarmConfig,
        CoverageAlarmState,
        calibration_tolerance,
    )
    from calibkit.temperature import softmax
    from service.monitoring.coverage import ChoiceState, _fold

    rng = np.random.default_rng(seed)
    alpha, raised = 0.1, 0
    for _ in range(count):
        z, y = CIFAR_LIKE.logits(rng, (2_000 + ALARM_LABELS,))
        p = softmax(z)
        k_reg = pick_k_reg(p[:1_000], y[:1_000], alpha)
        cal = SplitConformal.fit(p[1_000:2_000], y[1_000:2_000], "raps", k_reg=k_reg, lam=0.01, floor=True)
        scores = conformity_scores(p[2_000:], y[2_000:], "raps", k_reg=k_reg, lam=0.01, floor=True)
        null = alpha + calibration_tolerance(len(cal.scores), alpha)
        state = ChoiceState(
            "raps",
            1 - alpha,
            False,
            LogQuantileTracker.started(cal, alpha, DEFAULT_STEP),
            CoverageAlarmState.fresh(CoverageAlarmConfig(alpha=null, threshold=DEFAULT_THRESHOLD)),
        )
        static, alarmed = float(cal.quantile(alpha)), False
        for start in range(0, ALARM_LABELS, BATCH):
            part = scores[start : start + BATCH].tolist()
            state, transition = _fold(state, part, [1] * len(part), static, 0.0)
            alarmed |= transition is not None and transition["to"] == "alarm"
        raised += alarmed
    bound = ALARM_LABELS / DEFAULT_THRESHOLD + 0.01
    return {"streams": count, "labels": ALARM_LABELS, "raised": raised, "bound": bound}


#: Exchangeable: windows at the target less this at least ``WINDOW_SHARE`` of the time; overall coverage at the target
#: less ``OVERALL``; mean set size at most ``STATIC_RATIO`` of the static floor sets'. Shift: coverage from the
#: delay's end at the target less ``OVERALL``; mean set size at most ``ORACLE_RATIO`` of the oracle's.
WINDOW_POINTS, WINDOW_SHARE, OVERALL, STATIC_RATIO, ORACLE_RATIO = 0.03, 0.99, 0.01, 1.1, 1.25


def goals(e2e: dict, target: float = 0.9) -> list[dict]:
    """The end-to-end goals of the prediction sets, per data set and delay, from the sets the client received."""
    rows, out = e2e["streams"], []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["data"], r["delay"]), []).append(r)

    def judged(goal: str, kind: str, check, worst, sign: float = 1.0) -> None:
        """``worst(rows)`` of each group, the lowest shown (``sign`` -1 where the highest is worst)."""
        mine = {k: v for k, v in groups.items() if k[0] == kind}
        results = {k: check(v) for k, v in mine.items()}
        key = min(results, key=lambda k: worst(mine[k])) if results else None
        out.append(
            many(
                goal,
                sum(len(v) for v in mine.values()),
                bool(results) and all(results.values()),
                "" if key is None else f"{sign * worst(mine[key]) + 0.0:.4g}, {key[1]} delay {key[2]:,}",
            )
        )

    def share(v):
        return float(np.average([r["windows_ok"] for r in v], weights=[r["predictions"] for r in v]))

    def overall(v):
        return float(np.average([r["coverage"] for r in v], weights=[r["predictions"] for r in v]))

    judged(
        f"exchangeable, every delay: at least {WINDOW_SHARE:.0%} of windows of {WINDOW:,} predictions cover the target "
        f"less {WINDOW_POINTS * 100:g} points (worst: the share)",
        "exchangeable",
        lambda v: share(v) >= WINDOW_SHARE,
        share,
    )
    judged(
        f"exchangeable, every delay: overall coverage at least the target less {OVERALL * 100:g} point",
        "exchangeable",
        lambda v: overall(v) >= target - OVERALL,
        overall,
    )
    judged(
        f"exchangeable, every delay: mean set size at most {STATIC_RATIO:g}x the static floor sets' (worst: the ratio)",
        "exchangeable",
        lambda v: all(r["mean_size"] <= STATIC_RATIO * r["static_size"] for r in v),
        lambda v: -max(r["mean_size"] / r["static_size"] for r in v),
        -1.0,
    )
    judged(
        "exchangeable, every delay: no empty set (worst: the count)",
        "exchangeable",
        lambda v: all(r["empty"] == 0 for r in v),
        lambda v: -sum(r["empty"] for r in v),
        -1.0,
    )
    judged(
        "exchangeable over HTTP, every delay: no coverage alarm (worst: the streams raised)",
        "exchangeable",
        lambda v: all(r["alarm"] == "ok" for r in v),
        lambda v: -sum(r["alarm"] != "ok" for r in v),
        -1.0,
    )
    judged(
        f"after a shift, every delay: coverage from the delay's end at least the target less {OVERALL * 100:g} point",
        "shift",
        lambda v: all(r["coverage"] >= target - OVERALL for r in v),
        lambda v: min(r["coverage"] for r in v),
    )
    judged(
        f"after a shift, every delay: mean set size at most {ORACLE_RATIO:g}x an oracle calibrated on the shifted data "
        "(worst: the ratio)",
        "shift",
        lambda v: all(r["mean_size"] <= ORACLE_RATIO * r["reference_size"] for r in v),
        lambda v: -max(r["mean_size"] / r["reference_size"] for r in v),
        -1.0,
    )
    alarm = e2e["alarm"]
    out.append(
        many(
            f"coverage alarm in process, adaptation on: false alarms over {alarm['streams']} exchangeable "
            f"streams of {alarm['labels']:,} labels within the stated bound n / A + 0.01",
            alarm["streams"],
            alarm["raised"] / alarm["streams"] <= alarm["bound"],
            f"{alarm['raised']} of {alarm['streams']} raised (bound {alarm['bound']:.2f})",
        )
    )
    return out
