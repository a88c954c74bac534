"""The alarm benchmark's goals, judged on the rows of ``measure``."""

from __future__ import annotations

import numpy as np

from bench.alarm.measure import AFTER
from bench.common import many

MAX_RATIO = 1.5


def goals(result: dict) -> list[dict]:
    """The issue's goals, each with the rows it is checked on, whether all of them meet it, and the worst row."""
    fa, tolerance = result["false_alarms"], result["config"]["tolerance"]
    rows = [r for r in result["shifts"] if r["ece"] >= tolerance]  # a shift of ECE below eps is no miscalibration
    steps = [r for r in rows if not r["shift"].startswith("ramp")]

    beyond = [r for r in steps if _interval_low(r["family_blind_ci90"]) > MAX_RATIO]
    limit = max(steps, key=lambda r: _median(r["family_blind_ratio"]))
    clear_limit = max(steps, key=lambda r: _median(r.get("clear_family_blind_ratio")))
    quick = [r for r in rows if r["clear_oracle_p50"] is not None and r["clear_oracle_p50"] < 600]
    slowest_quick = max(quick, key=lambda r: _median(r["clear_p50"]), default=None)
    latched, flappy = max(rows, key=lambda r: r["latched"]), max(rows, key=lambda r: r["flaps"])
    tenth = [r for r in steps if 0.08 <= r["ece"] < 0.13]
    out = [
        many(
            "false alarms <= 1% per null and tolerance-edge row, 95% upper bound <= 2%",
            len(fa),
            all(r["rate"] <= 0.01 and r["ci95_high"] <= 0.02 for r in fa),
            "{rate:.2%} (<= {ci95_high:.2%}) {shape} {traffic}".format(
                **max(fa, key=lambda r: (r["rate"], r["ci95_high"]))
            ),
        ),
        *(_against_oracle(what, steps, key) for key, what in (("ratio", "detection"), ("clear_ratio", "clearing"))),
        many(
            f"information limit: the family-blind oracle itself within {MAX_RATIO}x of the oracle",
            len(steps),
            not beyond and _median(limit["family_blind_ratio"]) <= MAX_RATIO,
            f"{_median(limit['family_blind_ratio']):.2f} ({limit['family_blind_ci90']}, {limit['shape']} "
            f"{limit['shift']}); 90% interval above {MAX_RATIO} on {len(beyond)} rows",
        ),
        _against_family_blind("detection", "oracle", steps, "delay_p50", "family_blind_p50"),
        many(
            f"information limit (clearing): the family-blind clearing oracle within {MAX_RATIO}x of the "
            "clearing oracle",
            len(steps),
            _median(clear_limit.get("clear_family_blind_ratio")) <= MAX_RATIO,
            f"{_median(clear_limit.get('clear_family_blind_ratio')):.2f} ({clear_limit['shape']} "
            f"{clear_limit['shift']})",
        ),
        _against_family_blind("clearing", "clearing oracle", steps, "clear_p50", "clear_family_blind_p50"),
        many(
            "clearing: median <= 1000 where the oracle needs under 600",
            len(quick),
            all(r["clear_p50"] is not None and r["clear_p50"] <= 1_000 for r in quick),
            (slowest_quick and f"{slowest_quick['clear_p50']} ({slowest_quick['shape']} {slowest_quick['shift']})"),
        ),
        many(
            f"none still alarmed {AFTER} calibrated labels after the shift",
            len(rows),
            all(r["latched"] == 0 for r in rows),
            f"{latched['latched']:.1%} ({latched['shape']} {latched['shift']}; the clearing oracle "
            f"{latched.get('clear_oracle_latched', float('nan')):.1%}, the family-blind one "
            f"{latched.get('clear_family_blind_latched', float('nan')):.1%})",
        ),
        many(
            "flaps <= 2% on every row",
            len(rows),
            all(r["flaps"] <= 0.02 for r in rows),
            f"{flappy['flaps']:.1%} ({flappy['shape']} {flappy['shift']})",
        ),
        many(
            "at ECE ~0.10 faster than the naive 500-label window",
            len(tenth),
            all(_median(r["naive_delay_p50"]) > _median(r["delay_p50"]) for r in tenth),
            "; ".join(
                f"{r['shape']} {r['shift']}: {r['delay_p50']} vs {r['naive_delay_p50']}"
                for r in tenth
                if _median(r["naive_delay_p50"]) <= _median(r["delay_p50"])
            )
            or None,
        ),
    ]
    if result.get("warnings"):
        our_rules = [r for r in result["warnings"] if "D >=" in r["rule"]]
        out.append(
            many(
                "label-free warning: <= 1% of in-distribution checks",
                len(our_rules),
                all(r["rate"] <= 0.01 for r in our_rules),
                "{rate:.2%} (<= {ci95_high:.2%}) on {recent} recent".format(**max(our_rules, key=lambda r: r["rate"])),
            )
        )
    return out


def _against_oracle(what: str, steps: list[dict], key: str) -> dict:
    """The detector's median over the oracle's (``key``) on every row, the worst shown."""
    worst = max(steps, key=lambda r: _median(r[key]))
    met = sum(r[key] is not None and r[key] <= MAX_RATIO for r in steps)
    return many(
        f"{what}: median within {MAX_RATIO}x of the oracle on every row",
        len(steps),
        met == len(steps),
        f"{_median(worst[key]):.2f} ({worst['shape']} {worst['shift']}); {met} of {len(steps)} rows met",
    )


def _against_family_blind(what: str, oracle: str, steps: list[dict], ours: str, theirs: str) -> dict:
    """The detector's median over the family-blind ``oracle``'s (key ``theirs``) on every row, the slowest shown."""
    ratios = [_relative(r[ours], r.get(theirs)) for r in steps]
    slowest = int(np.argmax(ratios))
    return many(
        f"{what}: median within {MAX_RATIO}x of the family-blind {oracle} on every row",
        len(steps),
        max(ratios) <= MAX_RATIO,
        f"{ratios[slowest]:.2f} ({steps[slowest]['shape']} {steps[slowest]['shift']}); "
        f"{sum(r <= MAX_RATIO for r in ratios)} of {len(steps)} rows met",
    )


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
