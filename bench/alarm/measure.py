"""The alarm benchmark's measurements: seeded simulations of the detector, its oracles and the naive window on
synthetic traffic, the label-free warning on the committed model, and the HTTP runs; rows for ``goals`` and ``render``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
from scipy import stats

from bench.alarm import oracle
from bench.alarm.simulation import StreamOutcomes, draw, run_detector
from bench.common import PYTHON, RESULTS, ROOT, table
from calibkit import binning
from calibkit.alarms import AlarmPolicy, shift_is_material
from calibkit.detector import DetectorConfig
from calibkit.drift import confidence_shift
from calibkit.synthetic import Miscalibration, TrafficShape, population_ece

SHAPES = [
    TrafficShape("digits-like", 10, 20.0),
    TrafficShape("cifar-like", 10, 2.5),
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


def fit_curve(shape: TrafficShape, mis: Miscalibration, seed: int) -> oracle.AccuracyCurve:
    """a(C) = E[Y | C] of a shift, from ``ORACLE_SAMPLE`` of its predictions."""
    confidence, _, accuracy = mis.sample(shape, np.random.default_rng(seed), (ORACLE_SAMPLE,))
    return oracle.AccuracyCurve.fit(confidence, accuracy)


@dataclass(frozen=True)
class Oracle:
    """A row's oracle: a(C) of the shift and the tuned levels of its detection and clearing CUSUMs; of the
    size-blind oracle (told the shape of a(C) - C, not its size: a mixture over ``SIZES`` times it); and of the
    family-blind oracles (told only that the shift is one of the traffic shape's step shifts at one of
    ``FAMILY_SIZES`` times its size: the mixture over all of them), raising and clearing."""

    curve: oracle.AccuracyCurve
    family: tuple[oracle.AccuracyCurve, ...]
    level: float
    clear_level: float
    size_blind_level: float
    family_level: float
    family_clear_level: float
    tolerance: float

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
    ) -> Oracle:
        """The levels from ``streams`` streams of ``ORACLE_LABELS`` labels with the shift's confidences: outcomes at
        the nearest edge of the null to a(C) (detection), and outcomes of the shift itself (clearing), in chunks
        to bound memory."""
        rng = np.random.default_rng(seed)
        null_peaks, blind_peaks, family_peaks, shift_peaks, family_shift_peaks = [], [], [], [], []
        for chunk in np.array_split(np.arange(streams), max(1, streams // 50)):
            c, _, _ = mis.sample(shape, rng, (len(chunk), ORACLE_LABELS))
            a = curve(c)
            at_edge = (rng.random(c.shape) < oracle.nearest_edge(c, a, tolerance)).astype(np.float64)
            null_peaks.append(oracle.cusum_paths(oracle.detection_increments(c, at_edge, curve, tolerance)).max(axis=1))
            blind_peaks.append(_blind_paths(c, at_edge, (curve,), SIZES, tolerance).max(axis=1))
            family_peaks.append(_blind_paths(c, at_edge, family, FAMILY_SIZES, tolerance).max(axis=1))
            persisting = (rng.random(c.shape) < a).astype(np.float64)
            shift_peaks.append(oracle.cusum_paths(oracle.clearing_increments(c, persisting, curve)).max(axis=1))
            family_shift_peaks.append(oracle.blind_clearing_paths(c, persisting, family, FAMILY_SIZES).max(axis=1))
        level, clear_level, size_blind_level, family_level, family_clear_level = (
            oracle.tuned_level(np.concatenate(peaks), RATE)
            for peaks in (null_peaks, shift_peaks, blind_peaks, family_peaks, family_shift_peaks)
        )
        return cls(curve, family, level, clear_level, size_blind_level, family_level, family_clear_level, tolerance)

    def delays(self, confidence, correct, before: int, during: int) -> dict[str, np.ndarray]:
        """Per stream: labels from the shift to the oracle's alarm (``oracle``), from its end to the oracle's clear
        (``clear``: the clearing CUSUM runs from the shift's start), from the shift to the alarms of the
        size-blind and family-blind oracles, and from its end to the family-blind clearing oracle's clear
        (``family_blind_clear``, also from the shift's start), -1 for none."""
        c, y = confidence[:, : before + during], correct[:, : before + during]
        detect = oracle.cusum_paths(oracle.detection_increments(c, y, self.curve, self.tolerance))
        since = confidence[:, before:], correct[:, before:]
        clear = oracle.cusum_paths(oracle.clearing_increments(*since, self.curve))
        family_clear = oracle.blind_clearing_paths(*since, self.family, FAMILY_SIZES)
        return {
            "oracle": oracle.first_crossing(detect, self.level, before),
            "clear": oracle.first_crossing(clear, self.clear_level, during),
            "family_blind_clear": oracle.first_crossing(family_clear, self.family_clear_level, during),
            "size_blind": oracle.first_crossing(
                _blind_paths(c, y, (self.curve,), SIZES, self.tolerance), self.size_blind_level, before
            ),
            "family_blind": oracle.first_crossing(
                _blind_paths(c, y, self.family, FAMILY_SIZES, self.tolerance), self.family_level, before
            ),
        }


def _blind_paths(confidence, correct, curves, sizes, tolerance: float) -> np.ndarray:
    """The statistic of an oracle told only that the shift is one of ``curves`` at one of ``sizes`` times its size:
    the mean of the CUSUMs of all of them."""
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


def _ci_high(k: int, n: int) -> float:
    return float(stats.beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0


def _percentile(values: np.ndarray, q: float):
    return int(np.percentile(values, q)) if len(values) else None


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
                "ci95_high": _ci_high(k, args.streams),
            }
            _, ece = window_ece(confidence, correct)
            thresholds[f"{shape.name}: {name}"] = float(np.quantile(ece.max(axis=1), 0.99))
            peaks[f"{shape.name}: {name}"] = ece.max(axis=1)
            rows.append(row)
            print(table([row], FA_COLUMNS).splitlines()[-1], flush=True)
    for row in rows:
        row["naive_rate"] = float(np.mean(peaks[f"{row['shape']}: {row['traffic']}"] > max(thresholds.values())))
    return rows, thresholds


def shift_rows(args, config: DetectorConfig, thresholds: dict[str, float]) -> list[dict]:
    rows = []
    before, during, after = (BEFORE, DURING, AFTER) if not args.smoke else (300, 1_500, 1_000)
    for i, shape in enumerate(SHAPES):
        curves = [fit_curve(shape, mis, seed=_seed(i, j) + 50_000) for j, (mis, _) in enumerate(shifts(shape))]
        family = tuple(curve for curve, (_, ramp) in zip(curves, shifts(shape)) if not ramp)
        for j, (mis, ramp) in enumerate(shifts(shape)):
            seed = _seed(i, j)
            truth = Oracle.tune(
                shape, mis, curves[j], family, config.tolerance, args.oracle_streams, seed=seed + 60_000
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
                "delay_p90": _percentile(out.delay[detected], 90),
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
            rows.append(row)
            print(table([row], SHIFT_COLUMNS).splitlines()[-1], flush=True)
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
    """False warnings of the label-free drift check on in-distribution traffic: the committed digits model on
    its test split (the reference is the validation split), resampled into a stream of predictions checked
    every ``WARNING_EVERY`` predictions on the most recent ones, by the p-value alone and by the p-value
    with the effect size ``shift_distance``."""
    import onnxruntime as ort

    from training.data import load_digits_splits

    artifact = ROOT / "artifacts" / "digits-lenet5" / "1"
    manifest = json.loads((artifact / "manifest.json").read_text())
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    test = load_digits_splits().test
    served = session.run(["probabilities"], {"input": test.x})[0].max(axis=1).astype(np.float64)
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
            rows.append(
                {
                    "rule": name,
                    "recent": recent,
                    "checks": len(tests),
                    "warned": warned,
                    "rate": warned / len(tests),
                    "ci95_high": _ci_high(warned, len(tests)),
                    "ks_d_p99": float(np.quantile([t.statistic for t in tests], 0.99)),
                }
            )
            print(table([rows[-1]], WARNING_COLUMNS).splitlines()[-1], flush=True)
    return rows


def covariate_rows(args) -> dict:
    """The served model through HTTP (scripts/simulate_shift.py), noise and blur at severities 1, 3, 5."""
    out = RESULTS / ("alarm_covariate-smoke.json" if args.smoke else "alarm_covariate.json")
    command = [
        PYTHON,
        str(ROOT / "scripts" / "simulate_shift.py"),
        "--runs",
        "1" if args.smoke else "3",
        "--labels",
        "300" if args.smoke else "3000",
        "--max-shifted",
        "200" if args.smoke else "3000",
        "--corruptions",
        "gaussian_noise",
        "gaussian_blur",
        "--severities",
        *(["5"] if args.smoke else ["1", "3", "5"]),
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, cwd=ROOT, stdout=sys.stderr)
    return json.loads(out.read_text())


def feedback_rows(args) -> list[dict]:
    from bench import feedback_load

    return feedback_load.measure_rounds(["sqlite", "postgresql"], 1.0 if args.smoke else 10.0, 1, args.smoke)


def run(args) -> dict:
    """Every measurement of the benchmark, with ``args`` of ``python -m bench.alarm``:

    1. False alarms: ``--streams`` seeded streams of ``--labels`` labels for each traffic shape (confidences near 1
       like digits, spread over [0.2, 1] like CIFAR, a binary model, a label mix shifted to one class), each
       calibrated and at the edge of the tolerance: over-confident by exactly eps everywhere, under-confident by
       eps everywhere, off by eps in opposite directions on either side of 0.8, and off by eps with a sign that
       flips every ``FLIP`` labels. The rate with its 95% Clopper-Pearson interval.
    2. Shifts, after ``BEFORE`` calibrated labels, lasting ``DURING`` labels (longer where the oracle needs it: at
       least 2.5x its median, so no goal row is censored), then ``AFTER`` calibrated labels: logit scale x1.25,
       x1.5, x2.5, x0.5; mean-preserving miscalibration (over-confident above the median confidence,
       under-confident below); over-confidence of one class; a ramp to x2.5 over ``RAMP`` labels. Each row is
       measured against its oracle (``bench.alarm.oracle``): a CUSUM told a(C) = E[Y | C] of the shift, its level
       tuned on tolerance-edge traffic of the row's confidences to at most ``RATE`` false alarms per
       ``ORACLE_LABELS`` labels; for clearing, a CUSUM told that the shift has ended, its level tuned so that at
       most ``RATE`` of streams would clear within ``ORACLE_LABELS`` labels of a shift that persists. Two oracles
       that know less measure the information limit: the size-blind one (the shape of a(C) - C, not its size) and
       the family-blind one (only that the shift is one of the traffic shape's step shifts, at 0.5-2x its size).
       Medians are unconditional: a stream that never alarms (or never clears) counts as infinitely late. Per
       row: the oracle's median delay, the detector's, their ratio with a 90% bootstrap interval over streams,
       the detection rate, flaps (a clear while the shift lasts), the clearing medians and their ratio, and the
       share still alarmed at the end (latched), beside the share the clearing oracle had not cleared.
    3. The naive alternative a user would write: plug-in ECE (15 bins) of the last ``WINDOW`` labels, checked
       every ``EVERY`` labels, above one threshold tuned to at most 1% false alarms on every null row of part 1
       (the largest over rows of the 99th percentile of a stream's largest window ECE: a user does not know which
       shape tomorrow's traffic has).
    4. The label-free warning on in-distribution traffic: the committed digits model's test split, resampled into
       ``--warning-predictions`` predictions, checked every ``WARNING_EVERY`` predictions on the most recent ones
       against the manifest's reference confidences.
    5. Without ``--skip-http``: covariate shift through /predict on the served digits model
       (``scripts/simulate_shift.py``: gaussian noise and blur), and feedback throughput: single-label /feedback
       against single-row /predict (``bench.feedback_load``).
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
