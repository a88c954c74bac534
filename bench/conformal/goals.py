"""The conformal benchmark's goals (issue 43), judged on the rows of ``measure``; a goal whose measurement is missing
from the result is listed as not yet measured, so that the table shows the whole issue."""

from __future__ import annotations

from operator import itemgetter

from bench.common import many

#: Mean coverage within this of 1 - alpha.
COVERAGE_TOLERANCE = 0.005
#: The family-wise level of the law tests: each row's KS p-value against LAW_LEVEL / rows (Bonferroni).
LAW_LEVEL = 0.01
#: The worst bin of coverage by set size at least 1 - alpha - BIN_SLACK.
BIN_SLACK = 0.05
#: Sets of 64 rows at 1,000 classes within this many milliseconds (p-values, served on request only, are reported).
COST_MS = 0.5
#: Sets in /predict on the light model: rows/s with sets at least this share of rows/s without (a cost of 5%).
SERVING_RATIO = 0.95
#: Under shift: long-run coverage, and coverage over the window after the shift, at least the target less these; mean
#: set size within this factor of the oracle's.
LONG_RUN_POINTS, WINDOW_POINTS, SIZE_RATIO = 0.01, 0.03, 1.25
#: The coverage alarm: false alarms per 10,000 labels; mean delay within this factor of the oracle's.
ALARM_RATE, DELAY_RATIO = 0.01, 1.5
NOT_YET = [
    ("sets on the light model cost at most 5% of /predict throughput", "sets in /predict (serving)"),
    (
        "under shift: how far static split conformal falls on the digits corruptions (7 kinds x 5 severities) and "
        "the synthetic shifts",
        "the shift streams with labels in order (the adaptation's benchmark)",
    ),
    (
        "under shift, adaptation on: long-run coverage within 1 point of target over 10,000 labels, every stream",
        "the adaptive threshold from feedback (ACI or the quantile tracker)",
    ),
    (
        "under shift, adaptation on: coverage over the 2,000 labels after a shift within 3 points of target",
        "the adaptive threshold from feedback",
    ),
    (
        "under shift, adaptation on: mean set size at most 1.25x an oracle split conformal calibrated on the "
        "shifted data",
        "the adaptive threshold from feedback",
    ),
    ("coverage alarm: at most 1% false alarms per 10,000 labels at target", "the coverage alarm (monitoring)"),
    (
        "coverage alarm: a drop from 0.90 to 0.85 detected within 1.5x of an oracle CUSUM told the drop",
        "the coverage alarm (monitoring)",
    ),
]


def _where(row: dict) -> str:
    return f"{row['data']} alpha {row['alpha']:g} {row['method']}"


def goals(result: dict) -> list[dict]:
    """The issue's goals, each on the rows it is checked on."""
    rows = result["exchangeable"]
    exact = [r for r in rows if r["randomized"] or r["method"] == "LAC"]
    conservative = [r for r in rows if r not in exact]
    far, low = max(exact, key=lambda r: abs(r["excess"])), min(exact, key=lambda r: r["ks_p"])
    level, most = LAW_LEVEL / len(exact), max(conservative, key=lambda r: r["excess"])
    pairs = []
    for aps in (r for r in exact if r["method"] == "APS randomized"):
        raps = next(
            r
            for r in exact
            if r["method"] == "RAPS randomized" and (r["data"], r["alpha"]) == (aps["data"], aps["alpha"])
        )
        pairs.append((raps["size"] / aps["size"], aps, raps))
    ratio, aps, raps = max(pairs, key=lambda t: t[0])
    groups = _bin_groups(result["bins"])
    adaptive = {k: v for k, v in groups.items() if not k[2].startswith("LAC")}
    key, b = min(((k, _worst_bin(v)) for k, v in adaptive.items()), key=lambda t: t[1]["coverage"] - (1 - t[0][1]))
    lac = {k: v for k, v in groups.items() if k[2] == "LAC"}
    lac_key, lac_bin = min(((k, _worst_bin(v)) for k, v in lac.items()), key=lambda t: t[1]["coverage"] - (1 - t[0][1]))
    best = max(lac[lac_key], key=lambda b: b["coverage"])
    classes = [r for r in result["classes"] if r["method"] == "LAC" and r["sets"] == "marginal"]
    weak = min(classes, key=lambda r: r["worst_coverage"] - (1 - r["alpha"]))
    mondrian = [r for r in result["classes"] if r["sets"] == "mondrian"]
    weakest = min(mondrian, key=lambda r: r["worst_coverage"] - (1 - r["alpha"]))
    (big, slow, within), (listed, slow_listed, listed_within), (p_values, slow_p, p_within) = (
        _big_cost(result, ops) for ops in (("served", "sets"), ("listed",), ("p_values",))
    )
    small = [r for r in result["cost"] if r["classes"] == 10]
    slow_small = max(small, key=lambda r: r["median_ms"])
    out = [
        many(
            f"exchangeable: mean coverage within {COVERAGE_TOLERANCE * 100:g} points of 1 - alpha "
            "(LAC, randomized APS and RAPS)",
            len(exact),
            all(abs(r["excess"]) <= COVERAGE_TOLERANCE for r in exact),
            f"{far['excess'] * 100:+.2f} points (se {far['coverage_se'] * 100:.2f}), {_where(far)}",
        ),
        many(
            "exchangeable: per-split coverage consistent with its exact law (KS, family-wise level "
            f"{LAW_LEVEL:g}: each p >= {level:.2g})",
            len(exact),
            all(r["ks_p"] >= level for r in exact),
            f"p = {low['ks_p']:.3g} (D = {low['ks_d']:.3f}), {_where(low)}",
        ),
        many(
            "exchangeable: non-randomized APS and RAPS are conservative: mean excess over 1 - alpha",
            len(conservative),
            "reported",
            f"{most['excess'] * 100:+.2f} points, {_where(most)}",
        ),
        many(
            "RAPS's mean set size at most APS's at the same coverage (randomized: both exact)",
            len(pairs),
            all(t[0] <= 1.0 for t in pairs),
            (f"{raps['size']:.3f} against {aps['size']:.3f} ({ratio:.3f}x), {aps['data']} alpha {aps['alpha']:g}"),
        ),
        many(
            f"coverage by set size, APS and RAPS (randomized), bins of >= {result['setup']['min_bin_labels']} "
            f"labels: worst bin >= 1 - alpha - {BIN_SLACK:g}",
            len(adaptive),
            all(_worst_bin(v)["coverage"] >= 1 - k[1] - BIN_SLACK - 1e-12 for k, v in adaptive.items()),
            (f"{b['coverage']:.3f} at sizes {b['sizes']} ({b['labels']} labels), {key[0]} alpha {key[1]:g} {key[2]}"),
        ),
        many(
            "LAC's conditional weakness: its worst set-size bin and worst class",
            len(lac),
            "reported",
            f"bin {lac_bin['coverage']:.3f} at sizes {lac_bin['sizes']}, best {best['coverage']:.3f} at "
            f"{best['sizes']} ({lac_key[0]} alpha {lac_key[1]:g}); class "
            f"{weak['worst_class']} {weak['worst_coverage']:.3f} ({weak['data']} alpha {weak['alpha']:g})",
        ),
        many(
            "Mondrian (class-conditional) sets: worst per-class coverage",
            len(mondrian),
            "reported",
            f"class {weakest['worst_class']} {weakest['worst_coverage']:.3f} for 1 - alpha = "
            f"{1 - weakest['alpha']:g}, {_where(weakest)}",
        ),
        many(
            f"cost: sets of 64 rows at 1,000 classes, median <= {COST_MS:g} ms per method, as the service "
            "computes them for a batch (`served`: draws, ranking, sizes) and as masks (`sets`)",
            len(big),
            within == len(big),
            f"{slow['median_ms']:.3f} ms, {slow['op']} {slow['method']} ({within} of {len(big)} met)",
        ),
        many(
            "cost: the served sets of 64 rows at 1,000 classes listed for the responses and the log, median "
            "per method (reported: Python lists of every member, as long as the responses that carry them)",
            len(listed),
            "reported",
            f"{slow_listed['median_ms']:.3f} ms, {slow_listed['method']}, mean set size "
            f"{slow_listed['mean_set_size']:.1f} ({listed_within} of {len(listed)} within {COST_MS:g} ms)",
        ),
        many(
            "cost: p-values of 64 rows at 1,000 classes, median per method (reported: the issue asks for "
            "p-values on request only, and sets its cost goal on sets)",
            len(p_values),
            "reported",
            f"{slow_p['median_ms']:.3f} ms, {slow_p['method']} ({p_within} of {len(p_values)} within {COST_MS:g} ms)",
        ),
        many(
            "cost: sets and p-values of 64 rows at the light model's 10 classes",
            len(small),
            "reported",
            f"{slow_small['median_ms']:.3f} ms, {slow_small['op'].replace('_', '-')} {slow_small['method']}",
        ),
    ]
    pending = [] if "serving" in result else NOT_YET[:1]
    if "serving" in result:
        out.append(serving_goal(result["serving"]))
    if "shift" in result:
        out += shift_goals(result["shift"])
    else:
        pending += NOT_YET[1:]
    if "e2e" in result:
        from bench.conformal.e2e import goals as e2e_goals

        out += e2e_goals(result["e2e"])
    out += [many(goal, 0, "not yet measured", f"needs {needs}") for goal, needs in pending]
    return out


def _big_cost(result: dict, ops: tuple[str, ...]) -> tuple[list[dict], dict, int]:
    """The cost rows of ``ops`` at 1,000 classes, the slowest of them, and how many are within ``COST_MS``."""
    big = [r for r in result["cost"] if r["classes"] == 1_000 and r["op"] in ops]
    return big, max(big, key=lambda r: r["median_ms"]), sum(r["median_ms"] <= COST_MS for r in big)


def serving_goal(serving: dict) -> dict:
    """Sets in /predict, per request size: the throughput ratio a CPU-bound server reaches with the sets' own CPU per
    row, against ``SERVING_RATIO``; the rows/s ratio under load, which swings more, beside it."""
    summary = serving["summary"]
    low = min(summary, key=lambda s: s["cost_ratio"])
    shown = "; ".join(
        f"{s['rows']}-row {s['cost_ratio']:.3f} ({s['sets_cpu_us_per_row']:.1f} us of {s['without_cpu_us_per_row']:.0f}"
        f" per row at {s['cost_batch_rows']}-row batches; rows/s ratio {s['median_ratio']:.3f}, rounds "
        f"{s['low']:.3f}-{s['high']:.3f})"
        for s in summary
    )
    return many(
        f"sets on the light model cost at most {1 - SERVING_RATIO:.0%} of /predict throughput: CPU per row "
        f"without sets over with >= {SERVING_RATIO:g}, the sets' CPU measured in process at the batch size the "
        f"service formed under {serving['clients']} clients (single-row and 8-row requests)",
        sum(s["rounds"] for s in summary),
        all(s["cost_ratio"] >= SERVING_RATIO for s in summary),
        f"{low['cost_ratio']:.3f} at {low['rows']}-row; {shown}",
    )


def shift_goals(shift: dict) -> list[dict]:
    """The goals under shift, on the rows of the rule and step the service serves, and of the coverage alarm."""
    chosen = shift["chosen"]
    rows = [r for r in shift["streams"] if (r["method"], r["step"]) == (chosen["method"], chosen["step"])]
    target = 1 - shift["shift_setup"]["alpha"]
    name = f"{chosen['method']} {chosen['step']:g}"
    fall, big = min(rows, key=lambda r: r["static_after"]), max(rows, key=lambda r: r["size_ratio"])
    below = sum(r["static_after"] < target - LONG_RUN_POINTS for r in rows)
    fa = [r for r in shift["false_alarms"] if r["case"] == "default"]
    worst = max(fa, key=lambda r: r["ci95_high"])
    delays = {r["detector"]: r for r in shift["delays"]}
    mine, blind = delays["detector (default)"], delays["rate-blind oracle"]
    return [
        many(
            "under shift: how far static split conformal falls (coverage over the labels after the shift)",
            len(rows),
            "reported",
            f"{fall['static_after']:.3f} for {target:g}, {fall['data']} {fall['shift']}; {below} of "
            f"{len(rows)} shifts more than a point below",
        ),
        *(
            many(
                f"under shift, adaptation on ({name}): {what} at least the target less {points * 100:g} "
                "points, every stream (labels folded one by one, no delay)",
                len(rows),
                all(r[key] >= target - points - 1e-12 for r in rows),
                f"{far[key]:.4f}, {far['data']} {far['shift']}",
            )
            for key, points, what in (
                ("long_run", LONG_RUN_POINTS, "long-run coverage over 10,000 labels"),
                ("window", WINDOW_POINTS, "coverage over the 2,000 labels after the shift"),
            )
            for far in (min(rows, key=itemgetter(key)),)
        ),
        many(
            f"under shift, adaptation on ({name}): mean set size at most {SIZE_RATIO:g}x an oracle split "
            "conformal calibrated on the shifted data, at the same coverage",
            len(rows),
            all(r["size_ratio"] <= SIZE_RATIO for r in rows),
            f"{big['size_ratio']:.3f}x ({big['size']:.2f} against {big['oracle_size']:.2f}), {big['data']} "
            f"{big['shift']}; {sum(r['size_ratio'] <= SIZE_RATIO for r in rows)} of {len(rows)} met",
        ),
        many(
            "coverage alarm: at most 1% false alarms per 10,000 labels at target (i.i.d. misses at alpha, "
            "the least favourable null), 95% upper bound",
            len(fa),
            all(r["ci95_high"] <= ALARM_RATE for r in fa),
            f"{worst['rate']:.2%} (<= {worst['ci95_high']:.2%}) at alpha {worst['alpha']:g}, "
            f"{worst['streams']:,} streams",
        ),
        many(
            f"coverage alarm: a drop from 0.90 to 0.85 detected within {DELAY_RATIO:g}x the mean delay of an "
            "oracle CUSUM told the drop, at the same false-alarm rate",
            1,
            mine["ratio"] <= DELAY_RATIO,
            f"{mine['ratio']:.2f}x (90% CI {mine['ratio_ci90'][0]:.2f}-{mine['ratio_ci90'][1]:.2f}; "
            f"{mine['mean_delay']:.0f} against {delays['oracle CUSUM told the drop']['mean_delay']:.0f} labels); "
            f"rate-blind oracle {blind['ratio']:.2f}x",
        ),
    ]


def _bin_groups(bins: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for b in bins:
        out.setdefault((b["data"], b["alpha"], b["method"]), []).append(b)
    return out


def _worst_bin(bins: list[dict]) -> dict:
    return min(bins, key=lambda b: b["coverage"])
