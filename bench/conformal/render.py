"""The conformal benchmark's page, docs/conformal_benchmark.md: the goals, then the tables of ``measure``'s rows."""

from __future__ import annotations

from bench.common import CHECKED_COLUMNS, measured_by, table
from bench.conformal.measure import (
    BIN_COLUMNS,
    CLASS_COLUMNS,
    COST_ALPHA,
    COST_CALIBRATION,
    COST_COLUMNS,
    EXCHANGEABLE_COLUMNS,
    MIX,
)


def shift_section(shift: dict) -> list[str]:
    """The sections under shift and of the coverage alarm."""
    from bench.conformal.shift import (
        ALARM_COLUMNS,
        DELAY_COLUMNS,
        DROP_BEFORE,
        DROP_DURING,
        METHOD_COLUMNS,
        STREAM_COLUMNS,
        SYNTHETIC_CAL,
    )

    setup, chosen, about = shift["shift_setup"], shift["chosen"], shift["delay_setup"]
    rows = [r for r in shift["streams"] if (r["method"], r["step"]) == (chosen["method"], chosen["step"])]
    delays = [{**r, "ratio_ci90": "{:.2f}-{:.2f}".format(*r["ratio_ci90"])} for r in shift["delays"]]
    return [
        "## Under shift",
        "",
        f"Streams of {setup['before'] + setup['after']:,} labels in order: {setup['before']:,} of the data the static "
        f"LAC calibrator was fitted on, then {setup['after']:,} of a shift; target coverage {1 - setup['alpha']:g}. "
        f"**digits**: the committed model, static calibrator on the validation split; the stream draws from the "
        f"{setup['digits_pool']} images of the test split, clean, then under one corruption of "
        "`training.data.corruptions` (7 kinds x 5 severities) applied to "
        f"{setup['corruption_draws']} copies of the split (the noise differs between copies). The digits data has "
        "only 1,797 images, so the streams resample these pools **with replacement**. **cifar-like**: the static "
        f"calibrator on {SYNTHETIC_CAL:,} rows of calibrated synthetic traffic (`calibkit.synthetic`), the stream "
        "from pools of 50,000 rows of the clean traffic and of a shift: served probabilities at temperature 1/2.5 "
        "(over-confident) or 1/0.5 (under-confident), or a label mix with class 0's logit raised by 3. "
        f"{setup['replicates']} streams per shift, seeded.",
        "",
        "`static_after`, `static_window`: coverage of the static split-conformal threshold over the labels after "
        "the shift and over the 2,000 right after it. `long_run`: the adaptive rule's coverage over all 10,000 "
        "labels, `window`: over the 2,000 labels after the shift (each the lowest stream's). Each label is folded "
        "before the next is served (no delay), and the sets are LAC's without the floor. `size`: "
        "its mean set size after the shift. `oracle_size`: the mean set size of split conformal calibrated on the "
        "shifted pool itself (the population the stream resamples), at the coverage the adaptive rule reached "
        "after the shift. `size_ratio`: the largest ratio over the streams.",
        "",
        "### The rules and their steps",
        "",
        "ACI's gamma is on the level scale; the quantile tracker's eta on LAC's score scale [0, 1]; the log quantile "
        "tracker's on -log(1 - s) (-log p_y for LAC), truncated at log(1e4). `covers`: both "
        "coverage goals met on every stream; `bound`: the rule's deterministic bound on the distance of the long-run "
        "miss rate from alpha after the stream's 10,000 labels, which holds for every sequence, these streams or "
        "others; `met`: the size goal too. `chosen`: the rule and step the service serves "
        "(`calibkit.conformal.adaptive`'s default); a comparison with no label delay cannot choose a rule for a "
        "service whose labels come late ([0024](decisions/0024-sets-under-label-delay.md)).",
        "",
        table(shift["methods"], METHOD_COLUMNS),
        "",
        f"### Every stream, {chosen['method']} at step {chosen['step']:g}",
        "",
        table(rows, STREAM_COLUMNS),
        "",
        "## Coverage alarm",
        "",
        "`calibkit.coverage_alarm` on miss indicators. False alarms: streams of 10,000 i.i.d. misses at exactly "
        "alpha, the least favourable null (every null with a lower miss rate raises no more often, by coupling); "
        "`ci95_high`: the Clopper-Pearson 95% upper bound. `union bound`: the threshold 10^6 = 10,000 / 0.01 that "
        "proves 1% with no simulation.",
        "",
        table(shift["false_alarms"], ALARM_COLUMNS),
        "",
        f"Detection: {DROP_BEFORE:,} labels at coverage 0.90, then {DROP_DURING:,} at 0.85. The oracle CUSUM is told "
        "the drop: log Bern(err; 0.15) / Bern(err; 0.10), its level set so that 1% of 4,000 null streams of 10,000 "
        f"labels raise (level {about['oracle_level']:.2f} in log). The rate-blind oracle is told only that the drop "
        "is to one of the detector's rates, and its level is tuned the same way: the information limit of a detector "
        f"that does not know the drop. Streams that raised before the drop are left out ({about['early']}); "
        "`ratio`: mean delay over the oracle's, with a 90% bootstrap interval over streams.",
        "",
        table(delays, DELAY_COLUMNS),
        "",
    ]


def markdown(result: dict) -> str:
    m, setup = result["machine"], result["setup"]
    digits, synthetic = result["sources"]["digits"], result["sources"]["cifar-like"]
    k_regs = ", ".join(
        f"{r['data']} alpha {r['alpha']:g}: {r['k_reg']}"
        for r in result["exchangeable"]
        if r["method"] == "RAPS randomized"
    )
    mix = result["cost_mix"]
    lines = [
        "# Conformal benchmark",
        "",
        measured_by("make bench-conformal", m, result["wall_seconds"])
        + " Split conformal classification of `calibkit.conformal`, the adaptive "
        "thresholds of `calibkit.conformal.adaptive`, the alarm of `calibkit.coverage_alarm`, and the cost of sets in "
        "the service's /predict.",
        "",
        "## Goals",
        "",
        table(result["goals"], CHECKED_COLUMNS),
        "",
        "## Data",
        "",
        f"- **digits**: the committed default model `artifacts/digits-lenet5/1` (onnxruntime, its calibrated "
        f"`probabilities` output) on the {digits['pool']} images of the digits test split as `training.data` "
        f"loads them, which the model, its temperature and its reference never saw (accuracy "
        f"{digits['accuracy']:.3f}, mean top-label confidence {digits['mean_confidence']:.3f}). Each split "
        f"permutes them: {digits['n_cal']} for calibration, {digits['n_test']} for test. Label probabilities tied "
        f"within the pool: {digits['tied_label_probabilities']}. RAPS's `k_reg` is tuned on the "
        f"{digits['tuning']} images of the validation split (the temperature's), which no split uses.",
        f"- **cifar-like**: the calibrated synthetic traffic of `calibkit.synthetic` (logits N(0, "
        f"{synthetic['logit_scale']:g}^2) over 10 classes, labels drawn from their softmax; accuracy "
        f"{synthetic['accuracy']:.3f}, mean top-label confidence {synthetic['mean_confidence']:.3f}). Each split "
        f"draws its own {synthetic['n_cal']} calibration and {synthetic['n_test']} test rows; `k_reg` is tuned on "
        f"a separate sample of {synthetic['tuning']}.",
        f"- {setup['splits']} splits per data set, seeded. RAPS: `k_reg` from `pick_k_reg` at each alpha on the "
        f"tuning part ({k_regs}); lambda = {setup['lambda']:g}, the small value of Angelopoulos et al.'s "
        "adaptiveness runs: it trims the noisy tail of a set without turning RAPS into a fixed top-k, which a "
        "large lambda does at the cost of coverage by set size.",
        "",
        "## Coverage on exchangeable data",
        "",
        "`coverage`: the mean over splits of the share of test labels in their set, with its standard error "
        "`coverage_se` (over splits; for digits, given the pool). `exact_mean`: 1 - l / (n + 1), l = n + 1 - "
        "ceil((n + 1)(1 - alpha)), the mean of sets from scores without ties. `excess`: coverage - (1 - alpha). "
        "Given the calibration set, coverage is Beta(n + 1 - l, l); a split's count of covered test labels out of "
        "m is then BetaBinomial(m, n + 1 - l, l), exactly, for i.i.d. draws and for random splits of a fixed pool "
        "alike. `ks_d`, `ks_p`: KS test of the counts, through the randomized probability integral transform, "
        "against that law; run for LAC and the randomized APS and RAPS, whose scores have no ties (LAC's but for "
        "the tied probabilities counted above). The non-randomized APS and RAPS sets always hold the top label: "
        "they are conservative, and only their excess is reported. `size`: mean set size.",
        "",
        table(result["exchangeable"], EXCHANGEABLE_COLUMNS),
        "",
        "## Coverage by set size",
        "",
        f"Test labels pooled over the splits, by the size of their set, in bins of at least "
        f"{setup['min_bin_labels']} labels (sizes 0 and 1 share the first bin, as in the RAPS paper: an empty "
        "randomized set covers nothing by definition). `examples`: distinct test rows among them (digits reuses "
        "its pool across splits). LAC is shown for its conditional weakness: its small sets, the confident "
        "inputs, are covered more than its large ones.",
        "",
        table(result["bins"], BIN_COLUMNS),
        "",
        "## Coverage by class",
        "",
        "`marginal`: one threshold for all classes; `mondrian`: one per class (`classwise_quantiles`), for "
        "coverage given the class. `worst_class`, `worst_coverage`: the class whose test labels the sets held "
        "least often, pooled over the splits. A class with fewer than 1 / alpha - 1 calibration labels gets a "
        f"Mondrian threshold of +inf, so every set holds it: digits has about {digits['n_cal'] / 10:.0f} "
        "calibration labels per class, which at alpha 0.05 leaves some classes in every set.",
        "",
        table(result["classes"], CLASS_COLUMNS),
        "",
        "## Cost per batch",
        "",
        f"Per batch of 64 rows, at alpha {COST_ALPHA:g}, calibrated on {COST_CALIBRATION:,} rows, cycling over 32 "
        "batches; one thread, median and 90th percentile of the wall time per call. `served`: the sets the service "
        "computes for a batch (`ModelSets.sets` on the rows as float32, as the graphs return them: the draws from "
        "the prediction ids, each row's ranking and its set size); `listed`: the same, then each row's members as "
        "a list, the packed bits and the description (`ServedSets.listed`, what the responses and the log read); "
        "`sets`: `SplitConformal.sets`, masks, validation included; `p_values`: `SplitConformal.p_values`. At "
        "1,000 classes the rows are logits N(0, 1) plus "
        f"a boost: U(8, 14) on one class for {MIX[0]:.0%} of the rows (peaked), U(5, 8) on each of 5 classes for "
        f"{MIX[1]:.0%} (ambiguous between a few), none for {MIX[2]:.0%} (flat, an input unlike any class); labels "
        f"drawn from the probabilities. Median top probability {mix['1000']['top_p50']:.2f}, "
        f"{mix['1000']['top_below_0.5']:.0%} of rows below 0.5, top-1 accuracy {mix['1000']['top1']:.2f}, top-5 "
        f"{mix['1000']['top5']:.2f}, `k_reg` {mix['1000']['k_reg']}. At 1,000 classes each row is ranked by one sort "
        "of integer keys (a probability's leading bits, then its class), and an APS or RAPS set's size is found "
        "from block sums of the ranked probabilities (a row with ties, or too close to the threshold to tell, is "
        "sorted as floats). At 10 classes, the cifar-like traffic (`k_reg` "
        f"{mix['10']['k_reg']}). `mean_set_size`: over the timed batches."
        + (
            f" On this machine numpy sorts the keys of one such batch (64 x 1,000 int64) in {mix['sort_ms']:.3f} ms, "
            "the floor of the served ranking; where numpy's SIMD sort does not run on the CPU, that floor alone "
            "can exceed the 0.5 ms goal."
            if "sort_ms" in mix
            else ""
        ),
        "",
        table(result["cost"], [*COST_COLUMNS, "mean_set_size"]),
        "",
    ]
    for key, section in (("serving", serving_section), ("shift", shift_section), ("e2e", e2e_section)):
        if key in result:
            lines += section(result[key])
    return "\n".join(lines)


def e2e_section(e2e: dict) -> list[str]:
    """The section on the sets through the running service: how the streams were run, and every stream."""
    from bench.conformal.e2e import STREAM_COLUMNS

    s = e2e["setup"]
    return [
        "## End to end",
        "",
        "The service as users meet it: `python -m service` with default settings and a store of its own per "
        "stream, serving the committed digits model and a CIFAR-like model exported like a trained one (its logits "
        "the synthetic traffic's, temperature and conformal scores fitted on 2,000 calibrated rows); "
        f"{s['rows_per_request']} rows a `/predict` request, each label sent `delay` predictions after its "
        f"prediction, {s['labels_per_feedback']} a `/feedback` request; coverage and set size from the sets the "
        "client received, for the default choice (RAPS floor sets at 0.9). **exchangeable**: digits' test split and "
        f"fresh CIFAR-like traffic resampled, {s['measured']:,} predictions measured past the delay, {s['streams']} "
        f"streams per data set and delay. **shift**: {s['shift_before']:,} exchangeable predictions, then digits "
        f"under {s['digits_shift']} or CIFAR-like {s['cifar_shift']} (over-confident), measured from the delay's end "
        f"over max(20 delay, {s['shift_min']:,}) predictions, {s['shift_streams']} per data set and delay. "
        f"`worst_window`, `windows_ok`: the lowest window of {s['window']:,} and the share at the target less 3 "
        "points; `static_size`: the static floor sets on the same rows; `reference_size`: the static sets' "
        "(exchangeable) or an oracle's calibrated on the shifted pool at the coverage the stream reached (shift); "
        "`alarm`, `folded`: the coverage block at the end. The spread that the finite calibration split alone causes "
        "is about 2 points at the digits artifact's 180 rows, 1 point at the CIFAR-like 1,000.",
        "",
        table(e2e["streams"], STREAM_COLUMNS),
        "",
    ]


def serving_section(serving: dict) -> list[str]:
    """The section on sets in /predict: the summary per request size, then every round."""
    from bench.conformal.serving import ROUND_COLUMNS, SUMMARY_COLUMNS

    sets = serving["sets"]["conformal"]
    return [
        "## Sets in /predict",
        "",
        "One service process (`python -m service`, prediction logging on, to SQLite) serves the committed light model "
        "twice: as committed, so that every JSON /predict answers its default sets (computed once per batch on the "
        f"inference thread: {sets['method'].upper()}{' randomized' if sets['randomized'] else ''} at coverage "
        f"{sets['coverage']:g}, listed per row and logged), and as a second version with the same files but for the "
        "manifest's `conformal` field, removed, so that it serves none. "
        f"{serving['clients']} closed-loop clients (wrk) send the same seeded rows to each, single-row and 8-row "
        "requests, after a second of warm-up; rounds alternate the order (with, without, then without, with). "
        "`ratio`: rows/s with sets over rows/s without, per round; `median_ratio` and `ratio_range` over the "
        "rounds; `spread`: the larger max / min of either version's rows/s over the rounds (the machine's own "
        "noise, as `bench.serving.trees` judges a serving change). `with_batch_rows`, `batch_rows`: the mean rows per "
        "onnxruntime call the service formed (its `calib_batch_size_rows`), per round, and the smaller of the two "
        "versions' medians (sets slow a batch down, so more rows queue for the next one; the smaller batch is the "
        "dearer one per row).",
        "",
        "Two identical versions measured the same way swing as much as the ratio's range, so the rounds cannot "
        "resolve a few percent. The goal is judged on the sets' own CPU, measured in process where nothing else "
        "runs (`set_cost`): a batch of `batch_rows` rows (rounded to whole requests) served as the service serves "
        "it, with and without sets (the batch's sets, then each request's share, its /predict body encoded as the "
        "codec does, its prediction-log rows), alternating, thread CPU per call, median over "
        f"{serving.get('cost_repeats', 'the')} calls each, with the garbage collector set as the service sets it. "
        "`sets_cpu_us_per_row`: the difference per row; `path_cpu_us_per_row` what that path costs without sets; "
        "`without_cpu_us_per_row`: the service's CPU per row without sets under load (median over the rounds); "
        "`cost_ratio` = without / (without + sets): the throughput ratio a CPU-bound server reaches.",
        "",
        table(serving["summary"], SUMMARY_COLUMNS),
        "",
        table(serving["rounds"], ROUND_COLUMNS),
        "",
    ]
