"""Anytime-valid detection of miscalibration, with hysteresis, on a stream of labelled predictions.

Each label is a top-label confidence C_t and an outcome Y_t = 1[the predicted class is right]; the null
hypothesis is calibration within a tolerance eps at every confidence level,

    H0(eps):  |E[Y_t | C_t, past] - C_t| <= eps   for every t.

The statistic is a weighted mixture sum_d w_d S_t^(d) of CUSUM e-detectors, log S_t = max(log S_{t-1}, 0) + log e_t
(``calibkit.eprocess``, which derives the guarantee and folds the recursion), of learned and fixed bets
(``calibkit.calibration_bets``, which says what each bets and learns).

Guarantee: for every traffic shape of H0(eps), the alarm at level A (``threshold``) keeps
E[labels to the first false alarm] >= A and, by Ville's inequality, P(false alarm within n labels) <= n / A.
A raised alarm clears when a CUSUM of Bern(Y; C) / Bern(Y; C + kappa g(C)), g the gap learned since the alarm,
reaches B (``clear_threshold``); while a shift at least that large persists, P(a clear within n labels) <= n / B.
The state is frozen, with a leading axis of independent streams; folds in one call or in many agree (``eprocess``).

References: Shin, Ramdas & Rinaldo 2023, "E-detectors: a nonparametric framework for sequential change
detection"; Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting"; Lorden &
Pollak 2005, "Nonanticipating estimation applied to sequential analysis and changepoint detection"; Arnold,
Henzi & Ziegel 2023, "Sequentially valid tests for forecast calibration".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import numpy as np

from calibkit import calibration_bets, eprocess
from calibkit.eprocess import EProcess, EState, Readings, capped_exp
from calibkit.validation import check_int, check_threshold, check_unit, expected

STATE_FORMAT = 8
# The arrays of the bets' and the clearing test's learning, then those of the e-process
_LEARNING = (
    "gap_sum",
    "weight",
    "global_gap_sum",
    "global_weight",
    "pending_gap",
    "pending_count",
    "run_gap",
    "run_count",
    "table",
    "clear_pending_gap",
    "clear_pending_count",
    "raised_gap",
    "alarm_gap",
    "alarm_count",
)
_CORE = ("log_statistic", "log_clear", "raised_at", "cleared_at", "raises")
_FIELDS = (*_LEARNING, *_CORE, "n")


@dataclass(frozen=True)
class DetectorConfig:
    """Parameters of the detector; only ``tolerance`` and ``threshold`` enter the guarantee.

    Attributes:
        tolerance: eps; a gap |accuracy - confidence| up to eps at every confidence level is calibrated enough.
        threshold: A; the alarm is raised when the e-detector reaches A, so E[labels to a false alarm] >= A and
            P(false alarm within n labels) <= n / A.
        edges: Bin edges of the confidence, every 0.5 on the log-odds scale (logit(C) = -2.5 ... 6.5).
        bandwidth: Standard deviation, on the log-odds scale, of the kernel that pools neighbouring bins.
        half_lives: One learned detector per memory: the labels of a bin after which an old label weighs half.
        prior_labels: Pseudo-labels that shrink a bin's gap estimate towards the all-bin gap (for the adaptive
            detector: towards the estimate of the memory ``adaptive_prior``, an index of ``half_lives``).
        adaptive_prior: See ``prior_labels``.
        max_bet: The most a learned bet's e-value may lose (e_t >= 1 - max_bet).
        scales: The logit scales s of the fixed detectors that bet on accuracy sigmoid(logit(C) / s).
        scale_weight: The share of the logit scales in the mixture.
        gaps: The constant gaps g of the fixed detectors that bet on accuracy C + g.
        steps: The magnitudes m of the step alternatives: C -+ m above a pivot, C +- m below it.
        pivots: The log-odds p of the pivots of the step alternatives.
        step_weight: The share of the gaps and steps together in the mixture.
        block: Labels between refreshes of the gap estimates that the bets use.
        clear_threshold: B; the alarm clears when the evidence of calibration reaches B.
        clear_shrink: kappa; the clearing test pits calibration against kappa times the learned gap.
        clear_prior_labels: Pseudo-labels of the gap at the raise that the clearing gap is shrunk towards.
        min_clear_labels: Labels after the raise before the alarm may clear.
        clear_edges: The bins of the clearing gap: those of the bets and every 0.5 on the log-odds scale beyond
            them up to 12 (C = 1 - 6e-6), where a confident model's labels crowd and the gap of a logit scaling
            changes most between the shifted and the calibrated confidences.
    """

    tolerance: float = 0.01
    threshold: float = 1.25e4
    edges: tuple[float, ...] = tuple(float(1 / (1 + np.exp(-x / 2))) for x in range(-5, 14))
    bandwidth: float = 0.75
    half_lives: tuple[float, ...] = (10.0, 50.0, 250.0)
    prior_labels: float = 10.0
    adaptive_prior: int = 1
    max_bet: float = 0.5
    scales: tuple[float, ...] = (0.35, 0.5, 0.6, 0.7, 0.8, 0.87, 1.15, 1.25, 1.4, 1.6, 2.0, 2.5, 3.5)
    scale_weight: float = 0.35
    gaps: tuple[float, ...] = (-0.2, -0.1, -0.05, 0.05, 0.1, 0.2)
    steps: tuple[float, ...] = (0.05, 0.1, 0.2)
    pivots: tuple[float, ...] = tuple(x / 2 for x in range(-2, 21))
    step_weight: float = 0.3
    block: int = 16
    clear_threshold: float = 3e4
    clear_shrink: float = 1.0
    clear_prior_labels: float = 20.0
    min_clear_labels: int = 100
    clear_edges: tuple[float, ...] = tuple(float(1 / (1 + np.exp(-x / 2))) for x in range(-5, 25))

    def __post_init__(self):
        if not 0.0 <= self.tolerance < 0.5:
            raise ValueError(expected("tolerance", "in [0, 0.5)", self.tolerance))
        for name in ("threshold", "clear_threshold"):
            check_threshold(name, getattr(self, name))
        for name in ("edges", "clear_edges"):
            edges = getattr(self, name)
            if list(edges) != sorted(edges) or not all(0 < e < 1 for e in edges):
                raise ValueError(expected(name, "increasing and inside (0, 1)", edges))
        if not self.half_lives or min(self.half_lives) <= 0:
            raise ValueError(expected("half_lives", "non-empty and positive", self.half_lives))
        for name in ("prior_labels", "clear_prior_labels"):
            if getattr(self, name) <= 0:
                raise ValueError(expected(name, "positive", getattr(self, name)))
        check_unit("max_bet", self.max_bet)
        if not 0 < self.clear_shrink <= 1:
            raise ValueError(expected("clear_shrink", "in (0, 1]", self.clear_shrink))
        check_int("block", self.block, 1)
        check_int("min_clear_labels", self.min_clear_labels, 0)
        if not 0 <= self.adaptive_prior < len(self.half_lives):
            index = f"an index of `half_lives` (0 to {len(self.half_lives) - 1})"
            raise ValueError(expected("adaptive_prior", index, self.adaptive_prior))
        if any(s <= 0 or s == 1 for s in self.scales):
            raise ValueError(expected("scales", "positive and other than 1", self.scales))
        for name in ("gaps", "steps"):
            if any(abs(g) <= self.tolerance or abs(g) >= 1 for g in getattr(self, name)):
                within = f"beyond the tolerance {self.tolerance} and inside (-1, 1)"
                raise ValueError(expected(name, within, getattr(self, name)))
        if self.steps and not self.pivots:
            raise ValueError(expected("pivots", "non-empty when `steps` is", self.pivots))
        if self.pivots and not self.steps:
            raise ValueError(expected("steps", "non-empty when `pivots` is", self.steps))
        for name in ("scale_weight", "step_weight"):
            if getattr(self, name) < 0:
                raise ValueError(expected(name, "at least 0", getattr(self, name)))
        if self.scale_weight + self.step_weight >= 1:
            raise ValueError(
                expected(
                    "scale_weight + step_weight",
                    "less than 1 (the learned detectors share the rest)",
                    self.scale_weight + self.step_weight,
                )
            )
        if self.scales and not self.scale_weight:
            raise ValueError(expected("scale_weight", "positive when `scales` is non-empty", self.scale_weight))
        if self.stepped and not self.step_weight:
            raise ValueError(expected("step_weight", "positive when `gaps` or `steps` is non-empty", self.step_weight))

    @property
    def learned(self) -> int:
        """M + 1: one detector per memory and the adaptive one (the first M + 1 of ``detectors``)."""
        return len(self.half_lives) + 1

    @property
    def stepped(self) -> int:
        """Fixed detectors of constant gaps and steps: one per gap, and per step magnitude, orientation and pivot."""
        return len(self.gaps) + 2 * len(self.steps) * len(self.pivots)

    @property
    def fixed(self) -> int:
        """F: one fixed detector per logit scale, then the gaps and steps."""
        return len(self.scales) + self.stepped

    @property
    def detectors(self) -> int:
        """M + 1 + F: the learned detectors, then the fixed ones."""
        return self.learned + self.fixed

    @cached_property
    def log_weights(self) -> np.ndarray:
        """log w_d of the mixture: ``scale_weight`` shared by the logit scales, ``step_weight`` by the gaps and
        steps, the rest by the learned detectors."""
        scale = self.scale_weight if self.scales else 0.0
        step = self.step_weight if self.stepped else 0.0
        weights = (
            [(1 - scale - step) / self.learned] * self.learned
            + [scale / max(len(self.scales), 1)] * len(self.scales)
            + [step / max(self.stepped, 1)] * self.stepped
        )
        return np.log(np.asarray(weights))

    @property
    def n_bins(self) -> int:
        """The bins of the bets: one more than ``edges``."""
        return len(self.edges) + 1

    @property
    def clear_bins(self) -> int:
        """The bins of the clearing gap: one more than ``clear_edges``."""
        return len(self.clear_edges) + 1

    @cached_property
    def clear_to_bin(self) -> np.ndarray:
        """(clear_bins,): the bin of the bets that holds the lower edge of each clearing bin (bin 0 for the first)."""
        return np.searchsorted(self.edges, [0.0, *self.clear_edges], side="right")

    @cached_property
    def decay(self) -> np.ndarray:
        """Per memory, the weight a bin's sums keep at each label of that bin: 0.5 ** (1 / half-life)."""
        return 0.5 ** (1.0 / np.asarray(self.half_lives))

    @cached_property
    def block_decay(self) -> np.ndarray:
        """Per memory, the weight the all-bin sums keep over one block (each label decays them by
        ``decay`` ** (1 / bins), so the all-bin memory spans about as many labels as all bins' memories)."""
        return self.decay ** (self.block / self.n_bins)

    @cached_property
    def process(self) -> EProcess:
        """The e-process: the mixture of ``log_weights`` raised at A, one clearing CUSUM cleared at B."""
        return EProcess(self.log_weights, self.threshold, [[0]], 1, self.clear_threshold, self.min_clear_labels)

    @cached_property
    def kernel(self) -> np.ndarray:
        """(bins, bins) Gaussian weights between bin centres on the log-odds scale."""
        logits = np.log(np.asarray(self.edges) / (1 - np.asarray(self.edges)))
        step = np.diff(logits).mean() if len(logits) > 1 else 1.0
        centres = np.concatenate([[logits[0] - step / 2], (logits[1:] + logits[:-1]) / 2, [logits[-1] + step / 2]])
        return np.exp(-0.5 * ((centres[:, None] - centres[None, :]) / self.bandwidth) ** 2)


@dataclass(frozen=True)
class Fold:
    """What each label did to each stream, (streams, labels): whether it raised or cleared the alarm;
    ``e_value`` is (streams, detectors, labels)."""

    e_value: np.ndarray
    raised: np.ndarray
    cleared: np.ndarray


# The default of a state array: None, which __post_init__ replaces with its fresh value of the field's shape (typed
# as an array, which every field holds once the state exists)
_UNSET = cast(np.ndarray, None)


@dataclass(frozen=True, eq=False)
class DetectorState(Readings):
    """The detector's sufficient state for ``streams`` independent streams (arrays, leading axis = stream); frozen:
    ``fold`` returns a new state. ``DetectorState(config, streams)`` is the state before any label. ``statistic``
    (sum_d w_d S_t^(d), raised when it reaches A) and ``alarmed`` are read off its e-process (``eprocess.Readings``)."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    streams: int = 1
    gap_sum: np.ndarray = _UNSET
    weight: np.ndarray = _UNSET
    global_gap_sum: np.ndarray = _UNSET
    global_weight: np.ndarray = _UNSET
    pending_gap: np.ndarray = _UNSET
    pending_count: np.ndarray = _UNSET
    run_gap: np.ndarray = _UNSET
    run_count: np.ndarray = _UNSET
    table: np.ndarray = _UNSET
    clear_pending_gap: np.ndarray = _UNSET
    clear_pending_count: np.ndarray = _UNSET
    raised_gap: np.ndarray = _UNSET
    alarm_gap: np.ndarray = _UNSET
    alarm_count: np.ndarray = _UNSET
    log_statistic: np.ndarray = _UNSET
    log_clear: np.ndarray = _UNSET
    raised_at: np.ndarray = _UNSET
    cleared_at: np.ndarray = _UNSET
    raises: np.ndarray = _UNSET
    n: np.ndarray = _UNSET
    core: EState = field(init=False, repr=False)

    def __post_init__(self):
        s, m, k, d = self.streams, len(self.config.half_lives), self.config.n_bins, self.config.detectors
        learned, kc = self.config.learned, self.config.clear_bins
        shapes = {
            **dict.fromkeys(("gap_sum", "weight"), (s, m, k)),
            **dict.fromkeys(("global_gap_sum", "global_weight"), (s, m)),
            **dict.fromkeys(("pending_gap", "pending_count", "run_gap", "run_count"), (s, k)),
            **dict.fromkeys(
                ("clear_pending_gap", "clear_pending_count", "raised_gap", "alarm_gap", "alarm_count"), (s, kc)
            ),
            "table": (s, learned, k),
            "log_statistic": (s, d),
            "log_clear": (s, 1),
        }
        for name in _FIELDS:
            count = name in ("raised_at", "cleared_at", "raises", "n")
            dtype, shape = (np.int64, (s,)) if count else (np.float64, shapes[name])
            value = getattr(self, name)
            if value is None:
                value = np.full(shape, -1 if name in ("raised_at", "cleared_at") else 0, dtype)
            array = np.array(np.broadcast_to(value, shape) if name == "n" else value, dtype=dtype).reshape(shape)
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        core = EState(
            *(getattr(self, name) for name in _CORE[:2]), int(self.n[0]), *(getattr(self, x) for x in _CORE[2:])
        )
        object.__setattr__(self, "core", core)

    @property
    def clear_statistic(self) -> np.ndarray:
        """K_t, the evidence that calibration has returned (meaningful while alarmed)."""
        return capped_exp(self.log_clear[:, 0])

    def gaps(self) -> np.ndarray:
        """The gap accuracy - confidence around each bin that the learned detectors bet on
        (``calibration_bets.gap_table``)."""
        return calibration_bets.gap_table(self.config, vars(self))

    def fold(self, confidence, correct) -> DetectorState:
        """The state after the labels, folded in label order, raising and clearing alarms as the module docstring
        says (``trace`` also returns what each label did)."""
        return self.trace(confidence, correct)[0]

    def trace(self, confidence, correct) -> tuple[DetectorState, Fold]:
        """Fold labels into the state, in label order, raising and clearing alarms as the module docstring says:
        top-label confidences C_t and outcomes Y_t (1 when the predicted class was right, else 0), each (streams,
        labels), or (streams,) for one label per stream. Returns the state after the labels and what each label did.
        """
        c = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
        y = np.asarray(correct, dtype=np.float64)
        if c.ndim == 1:
            c, y = c[:, None], y[:, None]
        if c.shape != y.shape or c.shape[0] != self.streams:
            raise ValueError(
                f"Expected `confidence` and `correct` to have one shape, ({self.streams}, labels) or "
                f"({self.streams},), but got {np.shape(confidence)} and {np.shape(correct)}"
            )
        if (self.n != self.n[0]).any():
            raise ValueError(
                "Expected every stream of the state to have seen the same number of labels, but got "
                f"{sorted(set(self.n.tolist()))}"
            )
        cfg, total = self.config, c.shape[1]
        a = {name: getattr(self, name).copy() for name in _LEARNING}
        core = self.core
        e_value = np.ones((self.streams, cfg.detectors, total))
        raised = np.zeros(c.shape, bool)
        cleared = np.zeros(c.shape, bool)
        start = 0
        while start < total:
            stop = min(total, start + cfg.block - core.count % cfg.block)
            part = slice(start, stop)
            e_value[..., part], core = self._fold_block(
                a, core, c[:, part], y[:, part], raised[:, part], cleared[:, part]
            )
            if core.count % cfg.block == 0:
                calibration_bets.end_block(cfg, a, core)
            start = stop
        after = DetectorState(
            cfg, self.streams, **a, **{name: getattr(core, name) for name in _CORE}, n=np.full(self.streams, core.count)
        )
        return after, Fold(e_value, raised, cleared)

    def _fold_block(self, a: dict, core: EState, c: np.ndarray, y: np.ndarray, raised, cleared):
        """Labels of one block (or the part of it at hand): the bets of the whole part from the frozen gap table
        at once, then the e-process over them (``eprocess.advance``) up to each raise or clear, where the raise
        sets the gap the clearing test starts from (so its e-values are taken again). Returns the e-values and
        the e-process after the part; ``raised`` and ``cleared`` are filled in."""
        cfg = self.config
        rows = np.arange(self.streams)[:, None]
        b = np.searchsorted(cfg.edges, c, side="left")  # (streams, labels)
        e_value = calibration_bets.e_values(cfg, a["table"], b, c, y)
        log_e = np.log(e_value).transpose(2, 0, 1)  # (labels, streams, detectors)
        cells = (np.broadcast_to(rows, b.shape), b)
        np.add.at(a["pending_gap"], cells, y - c)
        np.add.at(a["pending_count"], cells, 1.0)
        bc = np.searchsorted(cfg.clear_edges, c, side="left")
        np.add.at(a["clear_pending_gap"], (cells[0], bc), y - c)
        np.add.at(a["clear_pending_count"], (cells[0], bc), 1.0)
        i, log_ratio = 0, None
        while i < c.shape[1]:
            if log_ratio is None and core.alarmed.any():
                log_ratio = calibration_bets.clear_log_ratio(cfg, a, c, bc, y).T[:, :, None]
            step = eprocess.advance(cfg.process, core, log_e[i:], None if log_ratio is None else log_ratio[i:])
            core, i = step.state, i + step.taken
            raised[:, i - 1], cleared[:, i - 1] = step.raised, step.cleared
            up = step.raised
            if up.any():
                a["raised_gap"][up] = a["table"][up].mean(axis=1)[:, cfg.clear_to_bin]
                a["alarm_gap"][up] = 0.0
                a["alarm_count"][up] = 0.0
                log_ratio = None
        return e_value, core

    def clear_alternative(self) -> np.ndarray:
        """The miscalibration g(C) that the clearing test pits calibration against
        (``calibration_bets.clear_alternative``)."""
        return calibration_bets.clear_alternative(self.config, vars(self))

    def regions(self) -> list[dict]:
        """The bins of a single-stream state as reports show them, one dict per bin: its confidence range
        (``confidence_low``, ``confidence_high``), the labels it weighs in the longest memory (``weight``) and the
        estimated gap accuracy - confidence, the mean over the learned detectors (``gap``)."""
        edges = [0.0, *self.config.edges, 1.0]
        gaps, weight = self.table[0].mean(axis=0), self.weight[0, -1] + self.pending_count[0]
        return [
            {"confidence_low": lo, "confidence_high": hi, "weight": float(w), "gap": float(g)}
            for lo, hi, w, g in zip(edges[:-1], edges[1:], weight, gaps)
        ]

    def worst_region(self) -> tuple[float, tuple[float, float]]:
        """(gap, (confidence low, confidence high)) of the bin of a single-stream state whose gap is largest, among
        the bins with labels."""
        regions = [r for r in self.regions() if r["weight"] >= 1.0] or self.regions()
        worst = max(regions, key=lambda r: abs(r["gap"]))
        return worst["gap"], (worst["confidence_low"], worst["confidence_high"])

    def to_dict(self) -> dict:
        """The JSON form of a single-stream state (the service persists one per model and calibration version): its
        arrays as lists, with the layout ``format`` and the settings its evidence depends on."""
        out = eprocess.state_dict(self.core, _settings(self.config), STATE_FORMAT, "n")
        return {**out, **{name: getattr(self, name).ravel().tolist() for name in _LEARNING}}

    @classmethod
    def from_dict(cls, data: dict, config: DetectorConfig) -> DetectorState:
        """Rebuild a single-stream state from ``to_dict`` output.

        A state saved under another format, tolerance, threshold, block or mixture (an older service, a changed
        configuration) or not a dict is not this detector's evidence, so a fresh state is returned for it.
        """
        core = eprocess.read_state(data, _settings(config), STATE_FORMAT, "n", 1)
        if core is None:
            return cls(config)
        progress = {name: getattr(core, name) for name in _CORE}
        return cls(config, 1, **{name: data[name] for name in _LEARNING}, **progress, n=np.full(1, core.count))


def _settings(config: DetectorConfig) -> dict:
    """The settings a state's evidence depends on, stored with it: the null, the level and the mixture (evidence
    gathered by another mixture is not this one's)."""
    return {
        "tolerance": config.tolerance,
        "threshold": config.threshold,
        "block": config.block,
        "scales": list(config.scales),
        "scale_weight": config.scale_weight,
        "gaps": list(config.gaps),
        "steps": list(config.steps),
        "pivots": list(config.pivots),
        "step_weight": config.step_weight,
    }
