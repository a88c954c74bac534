"""Benchmark of the miscalibration alarm itself (``make bench-alarm``), against an oracle.

1. False alarms: ``--streams`` (400) seeded streams of ``--labels`` (10,000) labels for each traffic shape
   (confidences near 1 like digits, spread over [0.2, 1] like CIFAR, a binary model, a label mix shifted to
   one class), each calibrated and at the edge of the tolerance: over-confident by exactly eps everywhere,
   under-confident by eps everywhere, off by eps in opposite directions on either side of 0.8, and off by
   eps with a sign that flips every ``FLIP`` labels. The rate with its 95% Clopper-Pearson interval.
2. Shifts, after ``BEFORE`` calibrated labels, lasting ``DURING`` labels (longer where the oracle needs it:
   at least 2.5x its median, so no goal row is censored), then ``AFTER`` calibrated labels: logit scale
   x1.25, x1.5, x2.5, x0.5; mean-preserving miscalibration (over-confident above the median confidence,
   under-confident below); over-confidence of one class; a ramp to x2.5 over 2,000 labels.
   Each row is measured against its oracle (``bench.alarm.oracle``): a CUSUM told a(C) = E[Y | C] of the shift,
   its level tuned on tolerance-edge traffic of the row's confidences to at most 1% false alarms per
   10,000 labels; for clearing, a CUSUM told that the shift has ended, its level tuned so that at most 1%
   of streams would clear within 10,000 labels of a shift that persists. Two oracles that know less measure the
   information limit: the size-blind one (the shape of a(C) - C, not its size) and the family-blind one (only
   that the shift is one of the traffic shape's step shifts, at 0.5-2x its size). Medians are unconditional: a
   stream that never alarms (or never clears) counts as infinitely late. Per row: the oracle's median
   delay, the detector's, their ratio with a 90% bootstrap interval over streams, the detection rate,
   flaps (a clear while the shift lasts), the clearing medians and their ratio, and the share still
   alarmed at the end (latched), beside the share the clearing oracle had not cleared.
3. The naive alternative a user would write: plug-in ECE (15 bins) of the last 500 labels, checked
   every 25 labels, above one threshold tuned to at most 1% false alarms on every null row of part 1
   (the largest over rows of the 99th percentile of a stream's largest window ECE: a user does not
   know which shape tomorrow's traffic has).
4. Covariate shift through /predict on the served digits model (``scripts/simulate_shift.py``):
   gaussian noise and blur.
5. Feedback throughput: single-label /feedback against single-row /predict (``bench.feedback_load``).
6. The label-free warning on in-distribution traffic: the committed digits model's test split,
   resampled into ``--warning-predictions`` (100,000) predictions, checked every ``WARNING_EVERY``
   predictions on the most recent ones against the manifest's reference confidences.
7. The goals, each checked on its rows.

Prints tables, writes bench/results/alarm.json and docs/alarm_benchmark.md.

    python -m bench.alarm [--streams 400] [--labels 10000] [--smoke] [--skip-http]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats

from bench.alarm import oracle
from bench.alarm.simulation import StreamOutcomes, draw, run_detector
from bench.alarm.traffic import Miscalibration, TrafficShape, population_ece
from bench.common import PYTHON, RESULTS, ROOT, machine, table, write_result
from calibkit import binning
from calibkit.alarms import AlarmPolicy, shift_is_material
from calibkit.detector import DetectorConfig
from calibkit.drift import confidence_shift

SHAPES = [
    TrafficShape("digits-like", 10, 20.0),
    TrafficShape("cifar-like", 10, 2.5),
    TrafficShape("binary", 2, 3.0),
    TrafficShape("label-shifted", 10, 2.5, class_offset=3.0),
]
BEFORE, DURING, AFTER, RAMP, FLIP = 2_000, 6_000, 4_000, 2_000, 300
MAX_DURING = 24_000  # a shift the oracle needs longer for lies at the null's edge (digits-like class 0: ECE 0.004)
WINDOW, EVERY = 500, 25
RATE = 0.01  # the false-alarm share per 10,000 labels that the oracles' levels are tuned to
ORACLE_LABELS, ORACLE_SAMPLE = 10_000, 400_000
WARNING_EVERY = 250
SIZES = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)  # the size-blind oracle's grid, times the true shift
FAMILY_SIZES = (0.5, 0.7, 1.0, 1.4, 2.0)  # the family-blind oracle's grid, times each shift of the traffic shape
FA_COLUMNS = ["traffic", "shape", "streams", "labels", "false_alarms", "rate", "ci95_high", "naive_rate"]
SHIFT_COLUMNS = [
    "shape",
    "shift",
    "ece",
    "oracle_p50",
    "size_blind_p50",
    "family_blind_p50",
    "delay_p50",
    "ratio",
    "ratio_ci90",
    "size_blind_ratio",
    "family_blind_ratio",
    "family_blind_ci90",
    "detected",
    "delay_p90",
    "flaps",
    "clear_oracle_p50",
    "clear_family_blind_p50",
    "clear_p50",
    "clear_ratio",
    "clear_family_blind_ratio",
    "latched",
    "clear_oracle_latched",
    "clear_family_blind_latched",
    "naive_delay_p50",
]
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
        levels = [
            oracle.tuned_level(np.concatenate(peaks), RATE)
            for peaks in (null_peaks, shift_peaks, blind_peaks, family_peaks, family_shift_peaks)
        ]
        return cls(curve, family, *levels, tolerance)

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
        oracle.cusum_paths(oracle.scaled_curve_increments(confidence, correct, curve, size, tolerance))
        for curve in curves
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
    false_alarm = above[:, ends <= before].any(axis=1)
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

    return feedback_load.measure_rounds(["sqlite", "postgresql"], 2.0 if args.smoke else 10.0, 1, args.smoke)


def markdown(result: dict) -> str:
    m, config = result["machine"], result["config"]
    lines = [
        "# Alarm benchmark",
        "",
        f'Measured by `make bench-alarm` on {m["cores"]} cores of "{m["cpu"]}" ({m["isa"]}), '
        f"{m['memory_gib']} GiB, Python {m['python']}, at commit `{m['commit']}`, in {result['seconds']:.0f} s. "
        f"Detector: tolerance {config['tolerance']}, threshold A = {config['threshold']:.3g} "
        f"(E[labels to a false alarm] >= A for any traffic within the tolerance), clearing threshold "
        f"B = {config['clear_threshold']:.3g}.",
        "",
        "## Goals",
        "",
        table(result["goals"], GOAL_COLUMNS),
        "",
        "## False alarms",
        "",
        table(result["false_alarms"], FA_COLUMNS),
        "",
        "`ci95_high`: the 95% Clopper-Pearson upper bound of the rate. `naive_rate`: the naive window at its "
        f"one threshold, ECE > {max(result['naive_thresholds'].values()):.4f}, on the same streams.",
        "",
        "## Shifts",
        "",
        f"{BEFORE} calibrated labels, then the shift for {DURING} labels (or `during`, at least 2.5x the oracle's "
        f"median), then {AFTER} calibrated, on {result['setup']['shift_streams']} streams per row. "
        "Delays in labels; "
        "medians are unconditional (a stream that never alarms, or never clears, counts as infinitely late; "
        "None: most never did). `oracle_p50`: a CUSUM told a(C) = E[Y | C] of the shift, its level tuned on "
        f"{result['setup']['oracle_streams']} streams of tolerance-edge traffic with the shift's confidences to "
        f"at most {RATE:.0%} false alarms per {ORACLE_LABELS:,} labels. `size_blind_p50`: an oracle told the "
        "shape of a(C) - C but not its size (the mean of the CUSUMs of 0.25-4 times the shift), its level tuned "
        "the same way; `size_blind_ratio` over the oracle. `family_blind_p50`: an oracle told only that the shift "
        "is one of this traffic shape's seven step shifts at 0.5-2 times its size (the mean of their 35 CUSUMs), "
        "tuned the same way; `family_blind_ratio` over the oracle with its 90% bootstrap interval "
        "`family_blind_ci90`: what not knowing which shift costs a detector that knows the whole benchmark. "
        "`ratio`: detector over oracle, "
        "`ratio_ci90` its 90% bootstrap interval over streams. `flaps`: share of detected streams whose alarm "
        "cleared while the shift lasted. `clear_oracle_p50`: a CUSUM of Bern(Y; C) / Bern(Y; a(C)) told that "
        f"the shift has ended, its level tuned so that at most {RATE:.0%} of streams clear within "
        f"{ORACLE_LABELS:,} labels of a persisting shift; `clear_p50` and `clear_ratio` over the streams "
        "alarmed when the shift ended. `clear_family_blind_p50`: a clearing oracle told only that the shift is "
        "one of the 35 of `family_blind_p50`, learning which from the labels since it began (the CUSUM of the "
        "Bayes factor of calibrated outcomes against their mixture, `bench.alarm.oracle.blind_clearing_paths`), "
        "tuned the same way; `clear_family_blind_ratio` over the clearing oracle. `latched`: still alarmed at "
        "the end; `clear_oracle_latched` and `clear_family_blind_latched`: the shares of streams the clearing "
        "oracles had not cleared by the end.",
        "",
        table(result["shifts"], ["during", *SHIFT_COLUMNS]),
        "",
        f"The goals leave out rows whose population ECE is below the tolerance ({config['tolerance']}): such a "
        "shift is inside the null (digits-like class 0), and the ramps from the ratio goals (the oracle is told "
        "the shift at full strength, which the ramp reaches only after 2,000 labels).",
        "",
    ]
    if result.get("warnings"):
        lines += [
            "## Label-free warning on in-distribution traffic",
            "",
            f"The committed digits model on its test split against the manifest's reference (validation split), "
            f"resampled into {result['setup']['warning_predictions']:,} predictions and checked every "
            f"{WARNING_EVERY} predictions (one evaluation pass a second at {WARNING_EVERY} predictions a second) "
            "on the most recent `recent` predictions. `ks_d_p99`: the 99th percentile of the KS distance.",
            "",
            table(result["warnings"], [*WARNING_COLUMNS, "ks_d_p99"]),
            "",
        ]
    cov = result.get("covariate")
    if cov:
        runs = cov["false_alarm_runs"]
        lines += [
            "## Covariate shift through /predict (digits model)",
            "",
            f"In-distribution streams: {sum(r['alarm'] for r in runs)} of {len(runs)} raised an alarm "
            f"({runs[0]['labels'] if runs else 0} labels each).",
            "",
            table(cov["scenarios"], ["scenario", "population_ece", "accuracy", "labels_to_alarm", "final_state"]),
        ]
    if result.get("feedback"):
        from bench.feedback_load import COLUMNS

        lines += [
            "",
            "## Feedback throughput",
            "",
            "Single-label POST /feedback against single-row POST /predict, "
            "32 wrk connections each, one service process per store; `stored`: labels found in the store "
            "afterwards (every acknowledged label is among them).",
            "",
            table(result["feedback"], COLUMNS),
        ]
    return "\n".join(lines) + "\n"


GOAL_COLUMNS = ["goal", "rows", "met", "worst"]
MAX_RATIO = 1.5


def goals(result: dict) -> list[dict]:
    """The issue's goals, each with the rows it is checked on, whether all of them meet it, and the worst row."""
    fa, tolerance = result["false_alarms"], result["config"]["tolerance"]
    rows = [r for r in result["shifts"] if r["ece"] >= tolerance]  # a shift of ECE below eps is no miscalibration
    steps = [r for r in rows if not r["shift"].startswith("ramp")]

    out = [
        {
            "goal": "false alarms <= 1% per null and tolerance-edge row, 95% upper bound <= 2%",
            "rows": len(fa),
            "met": all(r["rate"] <= 0.01 and r["ci95_high"] <= 0.02 for r in fa),
            "worst": "{rate:.2%} (<= {ci95_high:.2%}) {shape} {traffic}".format(
                **max(fa, key=lambda r: (r["rate"], r["ci95_high"]))
            ),
        }
    ]
    for key, what in (("ratio", "detection"), ("clear_ratio", "clearing")):
        worst = max(steps, key=lambda r: _median(r[key]))
        met = sum(r[key] is not None and r[key] <= MAX_RATIO for r in steps)
        out.append(
            {
                "goal": f"{what}: median within {MAX_RATIO}x of the oracle on every row",
                "rows": len(steps),
                "met": met == len(steps),
                "worst": f"{_median(worst[key]):.2f} ({worst['shape']} {worst['shift']}); "
                f"{met} of {len(steps)} rows met",
            }
        )
    beyond = [r for r in steps if _interval_low(r["family_blind_ci90"]) > MAX_RATIO]
    limit = max(steps, key=lambda r: _median(r["family_blind_ratio"]))
    out.append(
        {
            "goal": f"information limit: the family-blind oracle itself within {MAX_RATIO}x of the oracle",
            "rows": len(steps),
            "met": not beyond and _median(limit["family_blind_ratio"]) <= MAX_RATIO,
            "worst": f"{_median(limit['family_blind_ratio']):.2f} ({limit['family_blind_ci90']}, {limit['shape']} "
            f"{limit['shift']}); 90% interval above {MAX_RATIO} on {len(beyond)} rows",
        }
    )
    ours = [_relative(r["delay_p50"], r["family_blind_p50"]) for r in steps]
    slowest = int(np.argmax(ours))
    out.append(
        {
            "goal": f"detection: median within {MAX_RATIO}x of the family-blind oracle on every row",
            "rows": len(steps),
            "met": max(ours) <= MAX_RATIO,
            "worst": f"{ours[slowest]:.2f} ({steps[slowest]['shape']} {steps[slowest]['shift']}); "
            f"{sum(r <= MAX_RATIO for r in ours)} of {len(steps)} rows met",
        }
    )
    limit = max(steps, key=lambda r: _median(r.get("clear_family_blind_ratio")))
    out.append(
        {
            "goal": f"information limit (clearing): the family-blind clearing oracle within {MAX_RATIO}x of the "
            "clearing oracle",
            "rows": len(steps),
            "met": _median(limit.get("clear_family_blind_ratio")) <= MAX_RATIO,
            "worst": f"{_median(limit.get('clear_family_blind_ratio')):.2f} ({limit['shape']} {limit['shift']})",
        }
    )
    ours = [_relative(r["clear_p50"], r.get("clear_family_blind_p50")) for r in steps]
    slowest = int(np.argmax(ours))
    out.append(
        {
            "goal": f"clearing: median within {MAX_RATIO}x of the family-blind clearing oracle on every row",
            "rows": len(steps),
            "met": max(ours) <= MAX_RATIO,
            "worst": f"{ours[slowest]:.2f} ({steps[slowest]['shape']} {steps[slowest]['shift']}); "
            f"{sum(r <= MAX_RATIO for r in ours)} of {len(steps)} rows met",
        }
    )
    quick = [r for r in rows if r["clear_oracle_p50"] is not None and r["clear_oracle_p50"] < 600]
    slowest = max(quick, key=lambda r: _median(r["clear_p50"]), default=None)
    out.append(
        {
            "goal": "clearing: median <= 1000 where the oracle needs under 600",
            "rows": len(quick),
            "met": all(r["clear_p50"] is not None and r["clear_p50"] <= 1_000 for r in quick),
            "worst": slowest and f"{slowest['clear_p50']} ({slowest['shape']} {slowest['shift']})",
        }
    )
    latched = max(rows, key=lambda r: r["latched"])
    out.append(
        {
            "goal": f"none still alarmed {AFTER} calibrated labels after the shift",
            "rows": len(rows),
            "met": all(r["latched"] == 0 for r in rows),
            "worst": f"{latched['latched']:.1%} ({latched['shape']} {latched['shift']}; the clearing oracle "
            f"{latched.get('clear_oracle_latched', float('nan')):.1%}, the family-blind one "
            f"{latched.get('clear_family_blind_latched', float('nan')):.1%})",
        }
    )
    flappy = max(rows, key=lambda r: r["flaps"])
    out.append(
        {
            "goal": "flaps <= 2% on every row",
            "rows": len(rows),
            "met": all(r["flaps"] <= 0.02 for r in rows),
            "worst": f"{flappy['flaps']:.1%} ({flappy['shape']} {flappy['shift']})",
        }
    )
    tenth = [r for r in steps if 0.08 <= r["ece"] < 0.13]
    out.append(
        {
            "goal": "at ECE ~0.10 faster than the naive 500-label window",
            "rows": len(tenth),
            "met": all(_median(r["naive_delay_p50"]) > _median(r["delay_p50"]) for r in tenth),
            "worst": "; ".join(
                f"{r['shape']} {r['shift']}: {r['delay_p50']} vs {r['naive_delay_p50']}"
                for r in tenth
                if _median(r["naive_delay_p50"]) <= _median(r["delay_p50"])
            )
            or None,
        }
    )
    if result.get("warnings"):
        ours = [r for r in result["warnings"] if "D >=" in r["rule"]]
        out.append(
            {
                "goal": "label-free warning: <= 1% of in-distribution checks",
                "rows": len(ours),
                "met": all(r["rate"] <= 0.01 for r in ours),
                "worst": "{rate:.2%} (<= {ci95_high:.2%}) on {recent} recent".format(
                    **max(ours, key=lambda r: r["rate"])
                ),
            }
        )
    return out


def _relative(value: float | None, reference: float | None) -> float:
    """One median over another, None as infinitely late (a row the detector never crossed is infinitely slow)."""
    value, reference = _median(value), _median(reference)
    return value / max(reference, 1.0) if np.isfinite(value) else float("inf")


def _interval_low(interval: str) -> float:
    """The lower end of a ``_ratio_interval``."""
    low = float(interval.split("-")[0])
    return low if np.isfinite(low) else float("inf")


def _median(value: float | None) -> float:
    """A table's median or ratio, None (most streams never crossed) as infinitely late."""
    return float("inf") if value is None else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=400, help="streams per null row")
    parser.add_argument("--shift-streams", type=int, default=200, help="streams per shift row")
    parser.add_argument("--oracle-streams", type=int, default=500, help="streams that tune each oracle's levels")
    parser.add_argument("--labels", type=int, default=10_000)
    parser.add_argument("--warning-predictions", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--skip-http", action="store_true", help="only the simulations (no service processes)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite docs/alarm_benchmark.md from bench/results/alarm.json, goals recomputed",
    )
    args = parser.parse_args()
    if args.report_only:
        result = json.loads((RESULTS / "alarm.json").read_text())
        result["goals"] = goals(result)
        (ROOT / "docs" / "alarm_benchmark.md").write_text(markdown({"machine": machine(), **result}))
        return
    if args.smoke:
        args.streams, args.shift_streams, args.oracle_streams, args.labels = 20, 20, 50, 1_000
        args.warning_predictions = 10_000
    start = time.perf_counter()
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
    result["goals"] = goals(result)
    result["seconds"] = time.perf_counter() - start
    path = write_result("alarm", result, smoke=args.smoke)
    report = markdown({"machine": machine(), **result})
    print(report)
    if not args.smoke:
        (ROOT / "docs" / "alarm_benchmark.md").write_text(report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
