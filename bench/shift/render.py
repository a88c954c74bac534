"""The shift benchmark's page, docs/shift_benchmark.md: the goals, then the estimates, the priors and the adaptation,
and the digits model's intervals against its reference's calibration error."""

from __future__ import annotations

from bench.common import CHECKED_COLUMNS, measured_by, table
from bench.shift.streams import BOTH_SEVERITY, CORRUPTION_DRAWS, NOISE_STEP

ESTIMATE_COLUMNS = (
    "source shift condition alpha n accuracy mae_plain bias_plain cover_plain width_plain accuracy_adapted "
    "bias_adapted mae_adapted cover_adapted width_adapted mae_served_adapted mae_oracle mae_cbpe cbpe_ratio "
    "dev_served_adapted dev_cbpe dev_cbpe_ratio"
)
PRIOR_COLUMNS = (
    "source shift condition alpha n em_l1 bbse_l1 freq_l1 em_unconverged accuracy accuracy_adapted accuracy_oracle "
    "accuracy_gap nll_plain nll_adapted nll_oracle nll_ratio nll_recovered"
)
CARRIED_COLUMNS = (
    "source alpha n accuracy_adapted bias_adapted em_l1 cover_adapted width_adapted cover_carried width_carried "
    "carried_error"
)
ALARM_COLUMNS = (
    "source shift condition alpha threshold length raised bound left_band delay oracle_share oracle_delay "
    "raised_left_band delay_left_band oracle_delay_left_band"
)
SET_COLUMNS = (
    "source alpha rule calibration_rows em_l1 worst_unadapted worst_em worst_oracle worst_classwise mean_unadapted "
    "mean_em missed_unadapted missed_em missed_oracle size_unadapted size_em size_oracle size_classwise"
)
DIGITS_COLUMNS = (
    "shift condition alpha n accuracy bias_plain cover_plain cover_widened_gap cover_widened_ece cover_adapted "
    "cover_adapted_widened_ece"
)


def _shown(row: dict) -> dict:
    """A row with its coverages written with their Clopper-Pearson intervals."""
    out = dict(row)
    for key in ("cover_plain", "cover_adapted", "cover_carried"):
        if key in row:
            low, high = row[f"{key}_ci"]
            out[key] = f"{row[key]:.3f} [{low:.3f}, {high:.3f}]"
    for key in ("mae_cbpe", "cbpe_ratio", "dev_cbpe", "dev_cbpe_ratio"):
        out.setdefault(key, "")
    if row["alpha"] == "" or out.get("nll_recovered") is None:  # without label shift there is no gain to recover
        out["nll_recovered"] = ""
    return out


def _quantiles(q: list[float] | None) -> str:
    return "" if not q else f"{q[1]:,.0f} ({q[0]:,.0f}-{q[2]:,.0f})"


def _alarm_shown(row: dict) -> dict:
    """An alarm row with its share raised and interval, and its delays as median (10%-90%)."""
    out = dict(row)
    low, high = row["raised_ci"]
    out["raised"] = f"{row['raised']}/{row['streams']}: {row['raised_share']:.3f} [{low:.3f}, {high:.3f}]"
    out["threshold"] = f"{row['threshold']:g}"
    out["bound"] = f"{row['bound']:.4g}"
    for key in ("delay", "oracle_delay", "delay_left_band", "oracle_delay_left_band"):
        out[key] = _quantiles(row.get(key))
    for key in ("oracle_share", "raised_left_band"):
        out[key] = "" if row.get(key) is None else f"{row[key]:.3f}"
    return out


def _set_shown(row: dict) -> dict:
    """A sets row with the worst shift's coverage of each variant and its 95% t interval over the splits."""
    out = dict(row)
    for variant in ("unadapted", "em", "oracle", "classwise"):
        low, high = row[f"worst_{variant}_ci"]
        out[f"worst_{variant}"] = f"{row[f'worst_{variant}']:.4f} [{low:.4f}, {high:.4f}]"
    return out


def markdown(result: dict) -> str:
    m, setup, rows = result["machine"], result["setup"], result["rows"]
    shown = [_shown(r) for r in rows]
    sources = setup["sources"]
    error = result["reference_error"]
    d = error.get("digits")
    lines = [
        "# Shift benchmark",
        "",
        measured_by("make bench-shift", m, result.get("wall_seconds"))
        + f" {setup['streams']} seeded windows per row of {' and '.join(f'{n:,}' for n in setup['windows'])} "
        f"predictions; 95% intervals; seed {setup['seed']}. NannyML's CBPE: {result['cbpe']}.",
        "",
        "Sources (`bench/shift/streams.py`):",
        "",
        f"- `digits`: the committed default model (`artifacts/digits-lenet5/1`, onnxruntime) on the digits test "
        f"split ({sources.get('digits', {}).get('pools', {}).get('clean', '')} images), resampled; its reference is "
        f"the validation split ({sources.get('digits', {}).get('reference_rows', '')} rows). Covariate shift: every "
        f"corruption of `training/data/corruptions.py` at one severity, pooled ({CORRUPTION_DRAWS} noisy copies "
        "each).",
        f"- `cifar-like`: the CIFAR-like synthetic traffic of `calibkit.synthetic` (10 classes, logits N(0, 2.5^2), "
        "labels drawn from softmax(z), so the served probabilities are the true posteriors); its covariate shift "
        f"goes through its generator: the model sees z + e, e ~ N(0, ({NOISE_STEP} s)^2) at severity s, while the "
        "label follows z (inputs that lose information; over-confident probabilities).",
        "- `synthetic`: a 5-class source with known true posteriors and source priors "
        f"{[round(p, 3) for p in sources.get('synthetic', {}).get('true_priors', [])]} (class 0's logit + 1).",
        "",
        "Shifts: `none` (uniform resampling of the pool); `label`: priors pi_t ~ Dirichlet(alpha), class counts "
        "~ Multinomial(n, pi_t), rows drawn by class, so only the priors move; `covariate` at severities 1-5; "
        f"`both`: severity {BOTH_SEVERITY} with each alpha.",
        "",
        *_section("Goals", table(result["goals"], CHECKED_COLUMNS)),
        *_section(
            "Estimated accuracy",
            "`accuracy`: the mean realized accuracy of the served (unadapted) predictions. `mae_plain`, `bias_plain`: "
            "the mean confidence (`calibkit.estimated_accuracy.estimate_accuracy`) against it; `cover_plain`: the "
            "share of windows whose 95% Poisson-binomial interval holds it, with its 95% Clopper-Pearson interval; "
            "`width_plain`: the interval's mean width. With adaptation (EM priors, `adapt_probabilities`, the "
            "estimate recomputed): `accuracy_adapted`, the realized accuracy of the adapted argmax, `mae_adapted` and "
            "`cover_adapted` against it. `mae_served_adapted`: the adapted estimate of the unadapted predictions' "
            "accuracy, mean_i p'(argmax p_i), against `accuracy`; it is what CBPE estimates, so `cbpe_ratio` = "
            "`mae_served_adapted` / `mae_cbpe` on the same windows. `mae_oracle`: the same estimate from the "
            "probabilities adapted with the true priors (for the synthetic sources, the true posteriors): the error "
            "that no label-free estimate avoids, since the realized accuracy is itself a draw around what the "
            "posteriors expect (about sqrt(a (1 - a) / n)). `dev_served_adapted`, `dev_cbpe`: the mean distance of "
            "ours and of CBPE's from that expected accuracy instead of the realized one (exact for the synthetic "
            "sources, whose oracle holds the true posteriors; for digits the oracle holds the model's own "
            "probabilities adapted), and `dev_cbpe_ratio` their ratio.",
            table(shown, ESTIMATE_COLUMNS),
        ),
        *_section(
            "Priors and adaptation",
            "`em_l1`, `bbse_l1`: the mean L1 distance of EM's and BBSE's priors (source priors: the reference's mean "
            "calibrated probabilities; BBSE's confusion counts: the reference's) from the window's realized class "
            "frequencies; `freq_l1`: those frequencies from the priors the window was drawn with (sampling alone). "
            "`em_unconverged`: windows where EM ran out of iterations. `accuracy_oracle`, `nll_oracle`: the "
            "probabilities adapted with the true weights pi_t / pi_s (pi_s: the true source priors of the synthetic "
            "sources, the reference's mean probabilities for digits); `accuracy_gap`: oracle - adapted accuracy; "
            "`nll_ratio`: adapted NLL / oracle NLL - 1; `nll_recovered`: the share of the oracle's NLL gain over the "
            "unadapted probabilities that EM's adaptation recovers.",
            table(shown, PRIOR_COLUMNS),
        ),
        *_carried_section(result, shown),
        *_alarm_section(result),
        *_set_section(result),
        *_serving_section(result),
    ]
    if d:
        digits = [r for r in rows if r["source"] == "digits"]
        lines += _section(
            "The digits intervals and the reference's calibration error",
            f"The Poisson-binomial interval assumes calibrated confidences; the committed digits model's temperature "
            f"was fitted on part of its validation split, and on the test split (`bias_plain`) and per class its "
            f"confidence is not its accuracy. The "
            f"reference (validation) rows give the error to allow for: their top-label ECE (15 bins) is "
            f"{d['ece']:.4f} (95% bootstrap upper bound {d['ece_upper']:.4f}), their mean confidence minus "
            f"accuracy {d['gap']:+.4f} (|gap| upper bound {d['gap_upper']:.4f}). The plain estimate's bias is at "
            "most the population's |gap|, and |gap| <= ECE, so widening the interval by either upper bound "
            "([lower - b, upper + b]) accounts for the validation calibration error: `cover_widened_gap` and "
            "`cover_widened_ece` are the coverages of the widened intervals, `cover_adapted_widened_ece` that of the "
            "adapted interval widened the same way. The bound does not shrink with the "
            "window: it is the reference's uncertainty, which only more labelled reference rows reduce.",
            table([_shown(r) for r in digits], DIGITS_COLUMNS),
            "The reference's calibration error of every source: "
            + "; ".join(
                f"{name} ECE {e['ece']:.4f} (<= {e['ece_upper']:.4f}), gap {e['gap']:+.4f} "
                f"(|gap| <= {e['gap_upper']:.4f}) on {e['rows']} rows"
                for name, e in error.items()
            )
            + ".",
        )
    return "\n".join(lines)


def _section(title: str, *parts: str) -> list[str]:
    """A section of the page: its heading, then each paragraph or table."""
    return [f"## {title}", ""] + [line for part in parts for line in (part, "")]


def _carried_section(result: dict, shown: list[dict]) -> list[str]:
    label = [r for r in shown if r["shift"] == "label" and "cover_carried" in r]
    if not label:
        return []
    resamples = result["setup"].get("carry_resamples", "")
    return _section(
        "Adapted intervals that carry EM's error",
        "`cover_adapted`, `width_adapted`: the Poisson-binomial interval of the EM-adapted probabilities, which "
        "treats them as exact. `cover_carried`, `width_carried`: `calibkit.estimated_accuracy."
        f"estimate_adapted_accuracy` ({resamples} bootstrap resamples of the window's rows, EM rerun on each), the "
        "quantiles of the mixture over the resamples of the Poisson-binomial laws of the adapted confidences of the "
        "served predictions, each law normal with a continuity correction; against the same realized accuracy of "
        "the adapted predictions. `carried_error`: on the first windows of n <= 500, the most the normal "
        "approximation moved an end of the interval against the mixture of exact laws, in counts of n. `em_l1`: "
        "EM's priors from the window's class frequencies.",
        table(label, CARRIED_COLUMNS),
    )


def _alarm_section(result: dict) -> list[str]:
    rows = result.get("alarm", [])
    if not rows:
        return []
    return _section(
        "Label-shift alarm",
        "`calibkit.label_shift_alarm` with `LabelShiftAlarmConfig.for_reference` of each source's validation "
        "reference (tolerance 0.02, epsilon 0.01, margins for the reference's rows) and threshold A; streams of "
        "`length` predictions drawn from the pool as the windows are, the shift from the first prediction on. "
        "`raised`: streams raised within the length, with the 95% Clopper-Pearson interval of the share. "
        "`bound`: n / A + epsilon, what decision 0032 proves for unshifted traffic (the detector's n / A plus the "
        "probability that the reference's margins miss); at the default A = 10^8 it is about epsilon, at 10^5 "
        "n / A is the informative part, at 10^3 it is vacuous. `left_band`: the share of streams whose law moves "
        "some class's mean probability beyond its band (tolerance plus margins), the shifts the alarm is built "
        "to raise on. `delay`: predictions to the first raise among the raised, median (10%-90% quantiles). The "
        "oracle (`oracle_share`, `oracle_delay`) is told the new priors: the CUSUM of log sum_y w_y p(y | x_t), "
        "w = pi_t / pi_s (Page 1954; the fastest at its false-alarm rate, Lorden 1971), at the same A and "
        "without a tolerance. `raised_left_band`, `delay_left_band`, `oracle_delay_left_band`: the same among the "
        "streams that left the band. Covariate rows: no label shift; without labels the alarm cannot always tell "
        "the corrupted inputs' moved means from a label shift.",
        table([_alarm_shown(r) for r in rows], ALARM_COLUMNS),
    )


def _serving_section(result: dict) -> list[str]:
    serving = result.get("serving")
    if not serving:
        return []
    columns = ["rows", "rounds", "seconds", "median_ratio", "ratio_range", "spread", "median_cpu_ratio", "batch_rows"]
    always = ["adaptation_cpu_us_per_row", "path_cpu_us_per_row"]
    return _section(
        "Cost on /predict",
        "`bench/shift/serving.py`, measured as the sets' cost is (`bench/conformal/serving.py`): one service process "
        "serves the light model as version 1 (its manifest's `label_shift` entry: the evaluator folds its "
        "predictions into the label-shift alarm and estimates its priors every second) and as version 2 (without "
        "it), both with their default sets and the prediction log; wrk's 64 closed-loop clients alternate between "
        "them, round after round. `median_ratio`: rows/s of version 1 over version 2, the median over rounds, with "
        "their range and `spread` (the larger max / min of either version's rows/s over the rounds); "
        "`median_cpu_ratio`: the service's CPU per row without over with. With adaptation always, "
        "`adaptation_cpu_us_per_row` is the request path's own added CPU, measured in process, per request (the "
        "service adapts once per batch, so this is its upper bound), beside the path's.",
        *(
            f"`CALIB_SHIFT__ADAPT={mode}`:\n\n" + table(found["summary"], columns + always * (mode == "always"))
            for mode, found in serving.items()
        ),
    )


def _set_section(result: dict) -> list[str]:
    rows = result.get("sets", [])
    if not rows:
        return []
    setup = result["setup"]
    target = rows[0]["target"]
    return _section(
        "Sets under label shift",
        f"Split conformal sets at 1 - alpha = {target:g} (`calibkit.conformal`: LAC; APS randomized, one uniform "
        f"draw per row). Per source and Dirichlet concentration, {setup.get('set_shifts', '')} target priors; per "
        f"target, {rows[0]['splits']} random calibration splits of `calibration_rows` rows (digits: random halves of "
        "its 359 validation rows, so the mean is over the splits but given that one validation split; the "
        "synthetic sources: fresh rows of the source). Per split: `unadapted`, the marginal threshold; `em`, the "
        "weighted conformal quantile (`label_shift_quantiles`, Podkopaev & Ramdas 2021) with EM's weights from "
        f"{setup.get('set_window', 2000):,} unlabelled rows of the target (`em_l1`: their priors' L1 distance "
        "from the target's); `oracle`, weighted by the true ratios; `classwise`, Mondrian thresholds "
        "(`classwise_quantiles`), which cover every class and so any priors. A split's coverage under the target "
        "is sum_y pi_t(y) cov_y over the pool (exact given the split); a shift's is the mean over its splits. "
        "`worst_*`: the lowest shift's coverage, with its 95% t interval over the splits; `mean_*`: the mean over "
        f"the shifts; `missed_*`: shifts whose interval lies below {target - 0.01:g}; `size_*`: mean set size "
        "under the targets.",
        table([_set_shown(r) for r in rows], SET_COLUMNS),
        "**With the adaptive threshold** (decision 0033). Adaptive conformal inference's level alpha_t (Gibbs & "
        "Candès 2021) feeds the weighted quantile in place of alpha, and the miss it folds is the weighted set's: "
        "its long-run bound holds for any sets nested in the level, so for the weighted sets whatever the weights. "
        "The weights correct at once, before any label, what the priors explain; the level corrects from the "
        "labels what is left (EM's error, a shift of p(x | y)). The service serves the weighted sets at the static "
        "level while adapting, and the served log-scale tracker follows the unweighted sets: its bound is about its "
        "own marginal sets, so it would have to fold the weighted sets' misses to steer them.",
    )
