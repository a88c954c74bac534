"""The alarm benchmark's page, docs/alarm_benchmark.md: the goals, then the tables of ``measure``'s rows."""

from __future__ import annotations

from bench.alarm.measure import (
    AFTER,
    BEFORE,
    DURING,
    FA_COLUMNS,
    ORACLE_LABELS,
    RATE,
    SHIFT_COLUMNS,
    WARNING_COLUMNS,
    WARNING_EVERY,
)
from bench.common import CHECKED_COLUMNS, measured_by, table


def markdown(result: dict) -> str:
    m, config = result["machine"], result["config"]
    lines = [
        "# Alarm benchmark",
        "",
        measured_by("make bench-alarm", m, result["wall_seconds"]) + " "
        f"Detector: tolerance {config['tolerance']}, threshold A = {config['threshold']:.3g} "
        f"(E[labels to a false alarm] >= A for any traffic within the tolerance), clearing threshold "
        f"B = {config['clear_threshold']:.3g}.",
        "",
        "## Goals",
        "",
        table(result["goals"], CHECKED_COLUMNS),
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
