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
DIGITS_COLUMNS = (
    "shift condition alpha n accuracy bias_plain cover_plain cover_widened_gap cover_widened_ece cover_adapted "
    "cover_adapted_widened_ece"
)


def _shown(row: dict) -> dict:
    """A row with its coverages written with their Clopper-Pearson intervals."""
    out = dict(row)
    for key in ("cover_plain", "cover_adapted"):
        low, high = row[f"{key}_ci"]
        out[key] = f"{row[key]:.3f} [{low:.3f}, {high:.3f}]"
    for key in ("mae_cbpe", "cbpe_ratio", "dev_cbpe", "dev_cbpe_ratio"):
        out.setdefault(key, "")
    if row["alpha"] == "" or out.get("nll_recovered") is None:  # without label shift there is no gain to recover
        out["nll_recovered"] = ""
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
        "## Goals",
        "",
        table(result["goals"], CHECKED_COLUMNS),
        "",
        "## Estimated accuracy",
        "",
        "`accuracy`: the mean realized accuracy of the served (unadapted) predictions. `mae_plain`, `bias_plain`: "
        "the mean confidence (`calibkit.estimated_accuracy.estimate_accuracy`) against it; `cover_plain`: the share "
        "of windows whose 95% Poisson-binomial interval holds it, with its 95% Clopper-Pearson interval; "
        "`width_plain`: the interval's mean width. With adaptation (EM priors, `adapt_probabilities`, the estimate "
        "recomputed): `accuracy_adapted`, the realized accuracy of the adapted argmax, `mae_adapted` and "
        "`cover_adapted` against it. `mae_served_adapted`: the adapted estimate of the unadapted predictions' "
        "accuracy, mean_i p'(argmax p_i), against `accuracy`; it is what CBPE estimates, so `cbpe_ratio` = "
        "`mae_served_adapted` / `mae_cbpe` on the same windows. `mae_oracle`: the same estimate from the "
        "probabilities adapted with the true priors (for the synthetic sources, the true posteriors): the error "
        "that no label-free estimate avoids, since the realized accuracy is itself a draw around what the "
        "posteriors expect (about sqrt(a (1 - a) / n)). `dev_served_adapted`, `dev_cbpe`: the mean distance of "
        "ours and of CBPE's from that expected accuracy instead of the realized one (exact for the synthetic "
        "sources, whose oracle holds the true posteriors; for digits the oracle holds the model's own "
        "probabilities adapted), and `dev_cbpe_ratio` their ratio.",
        "",
        table(shown, ESTIMATE_COLUMNS),
        "",
        "## Priors and adaptation",
        "",
        "`em_l1`, `bbse_l1`: the mean L1 distance of EM's and BBSE's priors (source priors: the reference's mean "
        "calibrated probabilities; BBSE's confusion counts: the reference's) from the window's realized class "
        "frequencies; `freq_l1`: those frequencies from the priors the window was drawn with (sampling alone). "
        "`em_unconverged`: windows where EM ran out of iterations. `accuracy_oracle`, `nll_oracle`: the "
        "probabilities adapted with the true weights pi_t / pi_s (pi_s: the true source priors of the synthetic "
        "sources, the reference's mean probabilities for digits); `accuracy_gap`: oracle - adapted accuracy; "
        "`nll_ratio`: adapted NLL / oracle NLL - 1; `nll_recovered`: the share of the oracle's NLL gain over the "
        "unadapted probabilities that EM's adaptation recovers.",
        "",
        table(shown, PRIOR_COLUMNS),
        "",
    ]
    if d:
        digits = [r for r in rows if r["source"] == "digits"]
        lines += [
            "## The digits intervals and the reference's calibration error",
            "",
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
            "",
            table([_shown(r) for r in digits], DIGITS_COLUMNS),
            "",
            "The reference's calibration error of every source: "
            + "; ".join(
                f"{name} ECE {e['ece']:.4f} (<= {e['ece_upper']:.4f}), gap {e['gap']:+.4f} "
                f"(|gap| <= {e['gap_upper']:.4f}) on {e['rows']} rows"
                for name, e in error.items()
            )
            + ".",
            "",
        ]
    return "\n".join(lines)
