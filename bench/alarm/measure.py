"""The alarm benchmark's measurements: seeded simulations of the detector, its oracles and the naive window on
synthetic traffic, the label-free warning on the committed model, and the HTTP runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.alarm import oracle
from bench.alarm.simulation import StreamOutcomes, draw, run_detector
from bench.common import CIFAR_LIKE, PYTHON, RESULTS, ROOT, clopper_pearson, digits_model, progress
from calibkit import binning
from calibkit.alarms import AlarmPolicy, shift_is_material
from calibkit.detector import DetectorConfig
from calibkit.drift import confidence_shift
from calibkit.synthetic import Miscalibration, TrafficShape, population_ece

SHAPES = [
    TrafficShape("digits-like", 10, 20.0),
    CIFAR_LIKE,
    TrafficShape("binary", 2, 3.0),
    TrafficShape("label-shifted", 10, 2.5, class_offset=3.0),
]
BEFORE, DURING, AFTER, RAMP, FLIP = 2_000, 6_000, 4_000, 2_000, 300
MAX_DURING = 24_000  # a shift the oracle needs longer for lies at the null's edge (digits-like class 0)
WINDOW, EVERY = 500, 25
RATE = 0.01  # the false-alarm share per 10,000 labels that the oracles' levels are tuned to
ORACLE_LABELS, ORACLE_SAMPLE = 10_000, 400_000
WARNING_EVERY = 250
SIZES = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)  # the size-blind oracle's grid, times the true shift
FAMILY_SIZES = (0.5, 0.7, 1.0, 1.4, 2.0)  # the family-blind oracle's grid, times each shift of the traffic shape
FA_COLUMNS = ["traffic", "shape", "streams", "labels", "false_alarms", "rate", "ci95_high", "naive_rate"]
SHIFT_COLUMNS = (
    "shape shift ece oracle_p50 size_blind_p50 family_blind_p50 delay_p50 ratio ratio_ci90 size_blind_ratio "
    "family_blind_ratio family_blind_ci90 detected delay_p90 flaps clear_oracle_p50 clear_family_blind_p50 "
    "clear_p50 clear_ratio clear_family_blind_ratio latched clear_oracle_latched clear_family_blind_latched "
    "naive_delay_p50"
).split()
WARNING_COLUMNS = ["rule", "recent", "checks", "warned", "rate", "ci95_high"]


def shifts(shape: TrafficShape) -> list[tuple[Miscalibration, int]]:
    """(miscalibration, ramp) of each shift row: logit scales, gaps about the median, one class off, and a ramp."""
    median = float(np.median(shape.sample(np.random.default_rng(99), (50_000,))[0]))
    out = [(Miscalibration(f"logits x{s}", logit_scale=s), 0) for s in (1.25, 1.5, 2.5, 0.5)]
    out += [(Miscalibration(f"mean-preserving {g}", gap=g, mean_preserving=True, pivot=median), 0) for g in (0.1, 0.05)]
    out += [
        (Miscalibration("class 0 logits x3", logit_scale=3.0, only_class=0), 0),
        (Miscalibration("ramp to x2.5", logit_scale=2.5), RAMP),
    ]
    return out


def null_traffic(tolerance: float) -> list[tuple[str, Miscalibration | None, int]]:
    """(name, miscalibration, flip period) of the calibrated and tolerance-edge rows."""
    return [
        ("calibrated", None, 0),
        (f"over-confident by {tolerance}", Miscalibration("over", gap=tolerance), 0),
        (f"under-confident by {tolerance}", Miscalibration("under", gap=-tolerance), 0),
        (f"+-{tolerance} around 0.8", Miscalibration("around", gap=tolerance, mean_preserving=True, pivot=0.8), 0),
        (f"+-{tolerance}, sign flips every {FLIP}", Miscalibration("flip", gap=tolerance), FLIP),
    ]


def fit_curve(shape: TrafficShape, mis: Miscalibration, seed: int, n: int = ORACLE_SAMPLE) -> oracle.AccuracyCurve:
    """a(C) = E[Y | C] of a shift, from ``n`` of its predictions."""
    confidence, _, accuracy = mis.sample(shape, np.random.default_rng(seed), (n,))
    return oracle.AccuracyCurve.fit(confidence, accuracy)


@dataclass(frozen=True)
class Oracle:
    """A row's oracle: a(C) of the shift and the tuned level of each of ``_statistics``: the CUSUMs told a(C), the
    size-blind one (told a(C) - C's shape, a mixture over ``SIZES`` times it) and the family-blind ones (told only
    the traffic shape's step shifts at ``FAMILY_SIZES``), raising and clearing."""

    curve: oracle.AccuracyCurve
    family: tuple[oracle.AccuracyCurve, ...]
    tolerance: float
    levels: dict[str, float]

    @classmethod
    def tune(
        cls,
        shape: TrafficShape,
        mis: Miscalibration,
        curve: oracle.AccuracyCurve,
        family: tuple[oracle.AccuracyCurve, ...],
        tolerance: float,
        streams: int,
        seed: int,
        labels: int = ORACLE_LABELS,
    ) -> Oracle:
        """The levels from ``streams`` streams of ``labels`` with the shift's confidences: outcomes at the null's
        nearest edge to a(C) (detection) and of the shift itself (clearing), in chunks to bound memory."""
        rng = np.random.default_rng(seed)
        statistics, peaks = _statistics(curve, family, tolerance), defaultdict(list)
        for chunk in np.array_split(np.arange(streams), max(1, streams // 50)):
            c, _, _ = mis.sample(shape, rng, (len(chunk), labels))
            a = curve(c)
            at_edge = (rng.random(c.shape) < oracle.nearest_edge(c, a, tolerance)).astype(np.float64)
            persisting = (rng.random(c.shape) < a).astype(np.float64)
            for name, paths in statistics.items():
                outcomes = persisting if name.endswith("clear") else at_edge
                peaks[name].append(paths(c, outcomes).max(axis=1))
        return cls(curve, family, tolerance, {k: oracle.tuned_level(np.concatenate(p), RATE) for k, p in peaks.items()})

    def delays(self, confidence, correct, before: int, during: int) -> dict[str, np.ndarray]:
        """Per stream and statistic (-1: none): labels from the shift to its alarm, or from its end to its clear."""
        out = {}
        for name, paths in _statistics(self.curve, self.family, self.tolerance).items():
            clearing = name.endswith("clear")
            part = slice(before, None) if clearing else slice(0, before + during)
            crossed = paths(confidence[:, part], correct[:, part])
            out[name] = oracle.first_crossing(crossed, self.levels[name], during if clearing else before)
        return out


def _statistics(curve, family, tolerance: float) -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """The oracles' statistics as functions of (confidence, outcomes), detecting and clearing."""
    return {
        "oracle": lambda c, y: oracle.cusum_paths(oracle.detection_increments(c, y, curve, tolerance)),
        "size_blind": lambda c, y: _blind_paths(c, y, (curve,), SIZES, tolerance),
        "family_blind": lambda c, y: _blind_paths(c, y, family, FAMILY_SIZES, tolerance),
        "clear": lambda c, y: oracle.cusum_paths(oracle.clearing_increments(c, y, curve)),
        "family_blind_clear": lambda c, y: oracle.blind_clearing_paths(c, y, family, FAMILY_SIZES),
    }


def _blind_paths(confidence, correct, curves, sizes, tolerance: float) -> np.ndarray:
    """The mean CUSUM of ``curves`` at each of ``sizes`` times their size: an oracle told only the family."""
    return oracle.mixture_paths(
        oracle.cusum_paths(oracle.scaled_curve_increments(confidence, correct, accuracy, size, tolerance))
        for accuracy in (curve(confidence) for curve in curves)
        for size in sizes
    )


def window_ece(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Plug-in ECE of the last WINDOW labels at every EVERY-th label, per stream: (ends, (streams, checks))."""
    edges = binning.equal_width_edges(15)
    ends = np.arange(WINDOW, confidence.shape[1] + 1, EVERY)
    index = binning.bin_index(confidence.ravel(), edges).reshape(confidence.shape)
    total = np.zeros((confidence.shape[0], len(ends)))
    for b in range(15):
        residual = np.where(index == b, correct - confidence, 0.0)
        gap = np.concatenate([np.zeros((len(residual), 1)), np.cumsum(residual, axis=1)], axis=1)
        total += np.abs(gap[:, ends] - gap[:, ends - WINDOW])
    return ends, total / WINDOW


def naive_outcomes(confidence, correct, threshold: float, before: int, during: int) -> StreamOutcomes:
    ends, ece = window_ece(confidence, correct)
    above = ece > threshold
    streams = confidence.shape[0]
    false_alarm = np.any(above[:, ends <= before], axis=1)
    shift = (ends > before) & (ends <= before + during)
    first = np.where(above[:, shift].any(axis=1), ends[shift][np.argmax(above[:, shift], axis=1)] - before, -1)
    post = ends > before + during
    below = ~above[:, post]
    cleared = (
        np.where(below.any(axis=1), ends[post][np.argmax(below, axis=1)] - before - during, -1)
        if post.any()
        else np.full(streams, -1)
    )
    latched = above[:, -1] if above.shape[1] else np.zeros(streams, bool)
    return StreamOutcomes(false_alarm, first, np.zeros(streams, np.int64), np.where(first >= 0, cleared, -1), latched)


def false_alarm_rows(args, config: DetectorConfig) -> tuple[list[dict], dict[str, float]]:
    rows, thresholds, peaks = [], {}, {}
    for i, shape in enumerate(SHAPES):
        for j, (name, traffic, flip) in enumerate(null_traffic(config.tolerance)):
            confidence, correct = draw(shape, traffic, args.streams, 0, args.labels, seed=1000 + 10 * i + j, flip=flip)
            out = run_detector(confidence, correct, 0, args.labels, config=config)
            k = int((out.delay >= 0).sum())
            row = {
                "traffic": name,
                "shape": shape.name,
                "streams": args.streams,
                "labels": args.labels,
                "false_alarms": k,
                "rate": k / args.streams,
                "ci95_high": clopper_pearson(k, args.streams)[1],
            }
            _, ece = window_ece(confidence, correct)
            thresholds[f"{shape.name}: {name}"] = float(np.quantile(ece.max(axis=1), 0.99))
            peaks[f"{shape.name}: {name}"] = ece.max(axis=1)
            rows.append(progress(row, FA_COLUMNS))
    for row in rows:
        row["naive_rate"] = float(np.mean(peaks[f"{row['shape']}: {row['traffic']}"] > max(thresholds.values())))
    return rows, thresholds


def shift_rows(args, config: DetectorConfig, thresholds: dict[str, float]) -> list[dict]:
    rows = []
    before, during, after = (BEFORE, DURING, AFTER) if not args.smoke else (300, 1_500, 1_000)
    sample, labels = (ORACLE_SAMPLE, ORACLE_LABELS) if not args.smoke else (40_000, 2_000)  # a smoke run's oracles
    for i, shape in enumerate(SHAPES):
        curves = [fit_curve(shape, mis, _seed(i, j) + 50_000, sample) for j, (mis, _) in enumerate(shifts(shape))]
        family = tuple(curve for curve, (_, ramp) in zip(curves, shifts(shape)) if not ramp)
        for j, (mis, ramp) in enumerate(shifts(shape)):
            seed = _seed(i, j)
            truth = Oracle.tune(
                shape, mis, curves[j], family, config.tolerance, args.oracle_streams, seed + 60_000, labels
            )
            length, rest = during, after
            while True:
                confidence, correct = draw(shape, mis, args.shift_streams, before, length, rest, seed=seed, ramp=ramp)
                best = truth.delays(confidence, correct, before, length)
                needed = max(2.5 * oracle.unconditional_median(best["oracle"]), 1.5 * ramp)
                if args.smoke or needed <= length or length >= MAX_DURING:
                    break
                length = min(MAX_DURING, int(np.ceil(needed / 1000) * 1000) if np.isfinite(needed) else 4 * length)
            out = run_detector(confidence, correct, before, length, config)
            naive = naive_outcomes(confidence, correct, max(thresholds.values()), before, length)
            c, _, a = mis.sample(shape, np.random.default_rng(3), (100_000,))
            detected = out.delay >= 0
            clear_delay = out.clear_delay[out.alarmed_at_end]
            delay, clear, family_blind = best["oracle"], best["clear"], best["family_blind"]
            family_clear = best["family_blind_clear"]
            row = {
                "shape": shape.name,
                "shift": mis.name,
                "during": length,
                "ece": population_ece(c, a),
                "oracle_p50": _finite(oracle.unconditional_median(delay)),
                "size_blind_p50": _finite(oracle.unconditional_median(best["size_blind"])),
                "size_blind_ratio": _ratio(best["size_blind"], delay),
                "family_blind_p50": _finite(oracle.unconditional_median(family_blind)),
                "family_blind_ratio": _ratio(family_blind, delay),
                "family_blind_ci90": _ratio_interval(family_blind, delay, seed),
                "delay_p50": _finite(oracle.unconditional_median(out.delay)),
                "ratio": _ratio(out.delay, delay),
                "ratio_ci90": _ratio_interval(out.delay, delay, seed),
                "detected": float(detected.mean()),
                "delay_p90": int(np.percentile(out.delay[detected], 90)) if detected.any() else None,
                "flaps": float(np.mean(out.flaps[detected] > 0)) if detected.any() else 0.0,
                "clear_oracle_p50": _finite(oracle.unconditional_median(clear)),
                "clear_p50": _finite(oracle.unconditional_median(clear_delay)),
                "clear_ratio": _ratio(clear_delay, clear) if len(clear_delay) else None,
                "clear_family_blind_p50": _finite(oracle.unconditional_median(family_clear)),
                "clear_family_blind_ratio": _ratio(family_clear, clear),
                "latched": float(out.latched.mean()),
                "clear_oracle_latched": float(np.mean(clear < 0)),
                "clear_family_blind_latched": float(np.mean(family_clear < 0)),
                "naive_detected": float(np.mean(naive.delay >= 0)),
                "naive_delay_p50": _finite(oracle.unconditional_median(naive.delay)),
            }
            rows.append(progress(row, SHIFT_COLUMNS))
    return rows


def _seed(shape_index: int, shift_index: int) -> int:
    """The seed of a shift row's streams (its oracle's draws are offset from it)."""
    return 2000 + 10 * shape_index + shift_index


def _finite(value: float) -> float | None:
    """A median for the tables: None where it is infinite (most streams never crossed)."""
    return float(value) if np.isfinite(value) else None


def _ratio(delays: np.ndarray, oracle_delays: np.ndarray) -> float | None:
    """Unconditional median delay over the oracle's (None where either is infinite: most streams never crossed)."""
    ours, best = oracle.unconditional_median(delays), oracle.unconditional_median(oracle_delays)
    return float(ours / max(best, 1.0)) if np.isfinite(best) and np.isfinite(ours) else None


def _ratio_interval(delays: np.ndarray, oracle_delays: np.ndarray, seed: int, resamples: int = 500) -> str:
    """90% bootstrap interval of the ratio of medians, streams resampled (both delays of a stream together)."""
    rng = np.random.default_rng(seed)
    ours, best = oracle.never_as_infinite(delays), oracle.never_as_infinite(oracle_delays)
    index = rng.integers(0, len(ours), size=(resamples, len(ours)))
    ratios = np.median(ours[index], axis=1) / np.maximum(np.median(best[index], axis=1), 1.0)
    low, high = np.quantile(ratios, [0.05, 0.95])
    return f"{low:.2f}-{high:.2f}"


def warning_rows(args, policy: AlarmPolicy) -> list[dict]:
    """False warnings of the label-free drift check on in-distribution traffic (the digits test split, resampled),
    checked every ``WARNING_EVERY`` predictions by the p-value alone and with the effect size ``shift_distance``."""
    from training.data import load_digits_splits

    manifest = json.loads((ROOT / "artifacts" / "digits-lenet5" / "1" / "manifest.json").read_text())
    served = digits_model()(load_digits_splits().test.x).max(axis=1)
    reference = np.asarray(manifest["reference"]["confidences"], dtype=np.float64)
    stream = np.random.default_rng(17).choice(served, size=args.warning_predictions)
    rows = []
    for recent in (500, 5_000):
        ends = np.arange(max(recent, WARNING_EVERY), len(stream) + 1, WARNING_EVERY)
        tests = [confidence_shift(stream[end - recent : end], reference) for end in ends]
        loose = AlarmPolicy(shift_p_value=policy.shift_p_value, shift_distance=0.0)
        for name, rule in (
            (f"p < {policy.shift_p_value:g}", loose),
            (f"p < {policy.shift_p_value:g} and D >= {policy.shift_distance:g}", policy),
        ):
            warned = sum(shift_is_material(t, rule) for t in tests)
            row = {
                "rule": name,
                "recent": recent,
                "checks": len(tests),
                "warned": warned,
                "rate": warned / len(tests),
                "ci95_high": clopper_pearson(warned, len(tests))[1],
                "ks_d_p99": float(np.quantile([t.statistic for t in tests], 0.99)),
            }
            rows.append(progress(row, WARNING_COLUMNS))
    return rows


def covariate_rows(args) -> dict:
    """The served model through HTTP (scripts/simulate_shift.py), noise and blur at severities 1, 3, 5."""
    out = RESULTS / ("alarm_covariate-smoke.json" if args.smoke else "alarm_covariate.json")
    runs, labels, shifted, severities = ("1", "300", "200", "5") if args.smoke else ("3", "3000", "3000", "1 3 5")
    command = [PYTHON, str(ROOT / "scripts" / "simulate_shift.py"), "--runs", runs, "--labels", labels]
    command += ["--max-shifted", shifted, "--corruptions", "gaussian_noise", "gaussian_blur"]
    command += ["--severities", *severities.split(), "--out", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, stdout=sys.stderr)
    return json.loads(out.read_text())


def feedback_rows(args) -> list[dict]:
    from bench import feedback_load

    return feedback_load.measure_rounds(["sqlite", "postgresql"], 1.0 if args.smoke else 10.0, 1, args.smoke)


def run(args) -> dict:
    """Every measurement with ``args`` of ``python -m bench.alarm``:

    1. False alarms: ``--streams`` streams of ``--labels`` labels per traffic shape, calibrated and at the
       tolerance's edge (off by eps either way, either side of 0.8, or with a sign that flips every ``FLIP`` labels):
       the rate with its 95% Clopper-Pearson upper bound.
    2. Shifts (``shifts``) after ``BEFORE`` calibrated labels, lasting ``DURING`` (longer where the oracle needs it,
       so no goal row is censored), then ``AFTER`` calibrated: delays to alarm and to clear against the oracles as
       unconditional medians (a stream that never crosses counts as infinitely late), with 90% bootstrap intervals
       of the ratios; detection rate, flaps, latching.
    3. The naive window: plug-in ECE (15 bins) of the last ``WINDOW`` labels every ``EVERY`` labels, at one
       threshold that keeps every null row of part 1 at <= 1% false alarms (a user does not know tomorrow's shape).
    4. The label-free warning (``warning_rows``); without ``--skip-http``, covariate shift through /predict and
       feedback throughput.
    """
    policy = AlarmPolicy()
    config = policy.detector()
    fa, thresholds = false_alarm_rows(args, config)
    result = {
        "setup": vars(args),
        "config": {
            "tolerance": config.tolerance,
            "threshold": config.threshold,
            "clear_threshold": config.clear_threshold,
        },
        "false_alarms": fa,
        "naive_thresholds": thresholds,
        "shifts": shift_rows(args, config, thresholds),
        "warnings": warning_rows(args, policy),
    }
    if not args.skip_http:
        result["covariate"] = covariate_rows(args)
        result["feedback"] = feedback_rows(args)
    return result
