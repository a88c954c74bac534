"""The bets of the calibration alarm (``calibkit.detector``): what each label's e-values are, and what the bets
learn from the labels.

Each label is a top-label confidence C and an outcome Y in {0, 1}; the null is |E[Y | C, past] - C| <= eps
(``tolerance``). Every bet below gives e-values with E[e | C, past] <= 1 at every point of that band, so each
CUSUM of them is an e-detector (``calibkit.eprocess``).

- Learned bets (``e_values``): e = 1 + lambda (Y - C) - |lambda| eps, the plug-in Kelly bet lambda = (a - b) /
  (b (1 - b)) on the accuracy a = C + g against the nearest edge b = C +- eps of the band, where g is the gap
  accuracy - confidence of the label's bin estimated from earlier blocks of labels only (``gap_table``), so the
  bet is predictable (Lorden & Pollak 2005; Waudby-Smith & Ramdas 2023). E[e] = 1 + lambda (E[Y] - C) - |lambda|
  eps <= 1 inside the band; |lambda| is capped so that e >= 1 - ``max_bet``. The gaps are per confidence bin,
  pooled over neighbouring bins by a Gaussian kernel on the log-odds scale and shrunk towards an all-bin gap: one
  learned bet per memory (``half_lives``) and an adaptive one that uses only the labels of its current run.
- Fixed bets (``fixed_e_values``): the likelihood ratio Bern(Y; a(C)) / Bern(Y; e(C)) of an alternative a against
  its nearest point e(C) of the band (1 where a lies inside the band): a logit scaling, a constant gap, or a step
  of magnitude m about a pivot. Under any accuracy p in the band, E[e] is linear in p and is at most 1 at the
  nearest edge, so at every p of the band.
- The clearing test (``clear_alternative``, ``clear_log_ratio``): after a raise, a CUSUM of Bern(Y; C) /
  Bern(Y; C + kappa g(C)), g the gap of each clearing bin learned since the alarm and shrunk towards the gap at
  the raise; while a shift at least that large persists, P(a clear within n labels) <= n / B.

The learning state is a dict of arrays (``calibkit.detector.DetectorState``'s learning fields), updated in place
at the end of each block (``end_block``).

References: Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting"; Lorden &
Pollak 2005, "Nonanticipating estimation applied to sequential analysis and changepoint detection"; Arnold,
Henzi & Ziegel 2023, "Sequentially valid tests for forecast calibration".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from calibkit.eprocess import EState

if TYPE_CHECKING:
    from calibkit.detector import DetectorConfig

__all__ = ["BET_EDGE", "clear_alternative", "clear_log_ratio", "e_values", "end_block", "fixed_e_values", "gap_table"]

BET_EDGE = 1e-3  # bets and likelihood ratios keep probabilities this far from 0 and 1: a label's evidence is bounded


def e_values(cfg: DetectorConfig, table: np.ndarray, bins: np.ndarray, c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(streams, detectors, labels): the e-values of the learned bets on the gaps ``table`` (streams, M + 1, bins)
    of the labels' ``bins``, then those of the fixed bets, for confidences ``c`` and outcomes ``y`` (streams,
    labels)."""
    gap = np.take_along_axis(table, bins[:, None, :], axis=2)  # (streams, detectors, labels)
    cm = c[:, None, :]
    accuracy = np.clip(cm + gap, 0.0, 1.0)
    boundary = np.clip(cm + np.sign(gap) * cfg.tolerance, BET_EDGE, 1 - BET_EDGE)
    bet = np.where(np.abs(gap) > cfg.tolerance, (accuracy - boundary) / (boundary * (1 - boundary)), 0.0)
    cap = np.where(bet > 0, cfg.max_bet / (cm + cfg.tolerance), cfg.max_bet / (1 - cm + cfg.tolerance))
    bet = np.clip(bet, -cap, cap)
    learned = 1.0 + bet * (y - c)[:, None, :] - np.abs(bet) * cfg.tolerance
    return np.concatenate([learned, fixed_e_values(cfg, c, y)], axis=1)


def fixed_e_values(cfg: DetectorConfig, c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(streams, F, labels): Bern(Y; a(C)) / Bern(Y; e(C)) of each fixed alternative a, with e(C) its nearest
    point of the null band (1 inside the band): a_s(C) = sigmoid(logit(C) / s) per logit scale s, a_g(C) = C + g
    per gap g, then per step magnitude m, orientation o = 1, -1 and pivot p, C - o m where logit(C) > p and
    C + o m elsewhere."""
    log_odds = (np.log(np.clip(c, 1e-12, 1.0)) - np.log(np.clip(1.0 - c, 1e-12, 1.0)))[:, None, :]
    cm = c[:, None, :]
    scaled = 1.0 / (1.0 + np.exp(-log_odds / np.asarray(cfg.scales, dtype=np.float64)[None, :, None]))
    gapped = cm + np.asarray(cfg.gaps, dtype=np.float64)[None, :, None]
    above = log_odds > np.asarray(cfg.pivots, dtype=np.float64)[None, :, None]  # (streams, pivots, labels)
    steps = [cm + np.where(above, -o * m, o * m) for m in cfg.steps for o in (1.0, -1.0)]
    alternative = np.clip(np.concatenate([scaled, gapped, *steps], axis=1), BET_EDGE, 1 - BET_EDGE)
    edge = np.clip(np.clip(alternative, cm - cfg.tolerance, cm + cfg.tolerance), BET_EDGE, 1 - BET_EDGE)
    ratio = np.where(y[:, None, :] > 0.5, alternative / edge, (1 - alternative) / (1 - edge))
    return np.where(np.abs(alternative - cm) > cfg.tolerance, ratio, 1.0)


def gap_table(cfg: DetectorConfig, a: dict) -> np.ndarray:
    """The gap accuracy - confidence around each bin that the learned detectors bet on.

    From the labels of finished blocks, pooled over neighbouring bins by a Gaussian kernel of ``bandwidth`` on the
    log-odds scale and shrunk by ``prior_labels`` pseudo-labels: per memory towards its all-bin gap; for the
    adaptive detector (last), from the labels of its current run towards the memory ``adaptive_prior``. Returns
    (streams, M + 1, bins) gaps, one row per learned detector.
    """
    prior, kernel = cfg.prior_labels, cfg.kernel
    overall = a["global_gap_sum"] / (a["global_weight"] + prior)
    memories = (a["gap_sum"] @ kernel + prior * overall[..., None]) / (a["weight"] @ kernel + prior)
    adaptive = (a["run_gap"] @ kernel + prior * memories[:, cfg.adaptive_prior]) / (a["run_count"] @ kernel + prior)
    return np.concatenate([memories, adaptive[:, None, :]], axis=1)


def clear_alternative(cfg: DetectorConfig, a: dict) -> np.ndarray:
    """The miscalibration g(C) that the clearing test pits calibration against.

    The gap of each clearing bin over the labels since the alarm (from finished blocks), shrunk by
    ``clear_prior_labels`` pseudo-labels towards the gap estimated when the alarm was raised: (streams, clearing
    bins) gaps, 0 where a gap is inside the tolerance.
    """
    prior = cfg.clear_prior_labels
    estimate = (a["alarm_gap"] + prior * a["raised_gap"]) / (a["alarm_count"] + prior)
    return np.where(np.abs(estimate) > cfg.tolerance, estimate, 0.0)


def clear_log_ratio(cfg: DetectorConfig, a: dict, c: np.ndarray, b: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log Bern(Y; C) / Bern(Y; C + kappa g(C)) of each label of confidence ``c``, clearing bin ``b`` and outcome
    ``y``, against the alternative g of ``clear_alternative``."""
    null = np.clip(c, BET_EDGE, 1 - BET_EDGE)
    shift = cfg.clear_shrink * np.take_along_axis(clear_alternative(cfg, a), b, axis=1)
    alternative = np.clip(null + shift, BET_EDGE, 1 - BET_EDGE)
    return np.where(y > 0.5, np.log(null / alternative), np.log((1 - null) / (1 - alternative)))


def end_block(cfg: DetectorConfig, a: dict, core: EState) -> None:
    """Fold the finished block's sums (in ``a``) into the decayed sums and into the adaptive detector's run (a
    run that is not ahead, log S <= 0, starts again from this block), and refresh the gap table of the bets."""
    ahead = (core.log_statistic[:, cfg.learned - 1] > 0.0)[:, None]
    a["run_gap"] = np.where(ahead, a["run_gap"] + a["pending_gap"], a["pending_gap"])
    a["run_count"] = np.where(ahead, a["run_count"] + a["pending_count"], a["pending_count"])
    keep = cfg.decay[None, :, None] ** a["pending_count"][:, None, :]
    a["gap_sum"] = a["gap_sum"] * keep + a["pending_gap"][:, None, :]
    a["weight"] = a["weight"] * keep + a["pending_count"][:, None, :]
    a["global_gap_sum"] = a["global_gap_sum"] * cfg.block_decay + a["pending_gap"].sum(axis=1)[:, None]
    a["global_weight"] = a["global_weight"] * cfg.block_decay + a["pending_count"].sum(axis=1)[:, None]
    alarmed = core.alarmed[:, None]
    a["alarm_gap"] = np.where(alarmed, a["alarm_gap"] + a["clear_pending_gap"], a["alarm_gap"])
    a["alarm_count"] = np.where(alarmed, a["alarm_count"] + a["clear_pending_count"], a["alarm_count"])
    for name in ("pending_gap", "pending_count", "clear_pending_gap", "clear_pending_count"):
        a[name] = np.zeros_like(a[name])
    a["table"] = gap_table(cfg, a)
