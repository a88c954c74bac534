"""Anytime-valid miscalibration detection with hysteresis, on a stream of labelled predictions.

Each label is a top-label confidence C_t and an outcome Y_t = 1[predicted class is right]. The null
hypothesis is that calibration is within a tolerance eps at every confidence level,

    H0(eps):  |E[Y_t | C_t, past] - C_t| <= eps   for every t,

for any distribution of confidences, any number of classes (binary included) and any label mix.

**Raising (CUSUM e-detectors).** For a bet lambda_t(C_t) chosen from past labels only (predictable),

    e_t = 1 + lambda_t (Y_t - C_t) - |lambda_t| eps

has E[e_t | C_t, past] <= 1 under H0(eps) and e_t >= 1 - ``max_bet`` > 0, so it is an e-value; the
bet may depend on C_t itself, which is what lets the detector see miscalibration at every confidence
level. The bet is the plug-in Kelly bet of Waudby-Smith & Ramdas (2023, "Estimating means of bounded
random variables by betting"): with a the estimated accuracy at C_t and b = C_t +- eps the nearest
edge of the null, lambda = (a - b) / (b (1 - b)), whose growth rate is KL(Bern(a) || Bern(b)); a is
C_t plus the recent gap accuracy - confidence around C_t (exponentially weighted sums in bins of
width 0.5 on the log-odds scale, smoothed over neighbouring bins by a Gaussian kernel and shrunk
towards the all-bin gap), so over- and under-confidence in different regions (mean-preserving
miscalibration) both pay. The CUSUM e-detector of Shin, Ramdas & Rinaldo (2023, "E-detectors: a
nonparametric framework for sequential change detection")

    log S_t = max(log S_{t-1}, 0) + log e_t

is at most the Shiryaev-Roberts statistic R_t = (R_{t-1} + 1) e_t, and R_t - t is a supermartingale
under H0(eps), so by optional stopping P(S_t >= A for some t <= n) <= n / A, however often it is
looked at. M detectors run side by side, one per memory of the gap estimate (short memories adapt
to large shifts within tens of labels, long ones estimate small gaps precisely); the alarm is
raised when one reaches M A, so by the union bound

    P(false alarm within n labels) <= n / A         for every traffic shape of H0(eps):

A = 10^6 bounds the chance of any false alarm within 10,000 labels by 1%. Sequentially valid tests
of calibration of this kind are Arnold, Henzi & Ziegel (2023, "Sequentially valid tests for
forecast calibration").

**Clearing (hysteresis).** When the alarm is raised, the estimated gaps beyond the tolerance,
g(C) = sign(gap) max(|gap| - eps, 0), are frozen as the alternative "the miscalibration persists".
The alarm clears when the CUSUM of the likelihood ratio of calibrated outcomes against it,

    log K_t = max(log K_{t-1}, 0) + log[ Bern(Y_t; C_t) / Bern(Y_t; C_t + kappa g(C_t)) ],

reaches log B, at least ``min_clear_labels`` labels after the alarm. Calibrated traffic drives K
up at the rate KL(Bern(C) || Bern(C + kappa g)); while the miscalibration persists the expected
log ratio is negative and K stays near 1. After clearing, the e-detectors restart at 1, so raising
again needs fresh evidence of size A: the alarm neither latches nor flaps on noise.

The state is a set of arrays with a leading axis of independent streams, so the service (one
stream per model version and calibration version) and the simulations of ``bench/alarm.py``
(thousands of streams at once) run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

FORMAT = 2
_FIELDS = ("gap_sum", "weight", "global_gap_sum", "global_weight", "log_statistic", "alarmed", "alternative",
           "log_clear", "since_alarm", "n")


@dataclass(frozen=True)
class DetectorConfig:
    """Parameters of the detector; only ``tolerance`` and ``threshold`` enter the guarantee.

    - ``tolerance`` eps: a gap |accuracy - confidence| up to eps at every confidence level is calibrated enough.
    - ``threshold`` A: raise when the e-detector reaches A; P(false alarm within n labels) <= n / A.
    - ``edges``: bin edges of the confidence, every 0.5 on the log-odds scale (logit(C) = -2.5 ... 6.5).
    - ``bandwidth``: standard deviation, on the log-odds scale, of the kernel that pools neighbouring bins.
    - ``half_lives``: one detector per memory: labels of a bin after which an old label weighs half.
    - ``prior_labels``: pseudo-labels that shrink a bin's gap estimate towards the all-bin gap.
    - ``max_bet``: the most an e-value may lose (e_t >= 1 - max_bet).
    - ``clear_threshold`` B, ``clear_shrink`` kappa, ``min_clear_labels``: the clearing rule.
    """

    tolerance: float = 0.01
    threshold: float = 1e6
    edges: tuple[float, ...] = tuple(float(1 / (1 + np.exp(-x / 2))) for x in range(-5, 14))
    bandwidth: float = 0.75
    half_lives: tuple[float, ...] = (10.0, 50.0, 250.0)
    prior_labels: float = 10.0
    max_bet: float = 0.5
    clear_threshold: float = 300.0
    clear_shrink: float = 1.0
    min_clear_labels: int = 100

    def __post_init__(self):
        if not 0.0 <= self.tolerance < 0.5:
            raise ValueError(f"tolerance must lie in [0, 0.5), got {self.tolerance}")
        if self.threshold <= 1 or self.clear_threshold <= 1:
            raise ValueError("threshold and clear_threshold must exceed 1")
        if list(self.edges) != sorted(self.edges) or not all(0 < e < 1 for e in self.edges):
            raise ValueError("edges must be increasing and inside (0, 1)")
        if min(self.half_lives) <= 0 or self.prior_labels <= 0 or not 0 < self.max_bet < 1 or not 0 < self.clear_shrink <= 1:
            raise ValueError("need half_lives > 0, prior_labels > 0, 0 < max_bet < 1 and 0 < clear_shrink <= 1")

    @property
    def n_bins(self) -> int:
        return len(self.edges) + 1

    @cached_property
    def decay(self) -> np.ndarray:
        """Per memory, the weight a bin's sums keep at each label of that bin: 0.5 ** (1 / half-life)."""
        return 0.5 ** (1.0 / np.asarray(self.half_lives))

    @cached_property
    def log_raise(self) -> float:
        """log(M A): the level at which one of the M detectors raises the alarm."""
        return float(np.log(self.threshold * len(self.half_lives)))


@dataclass(frozen=True)
class Step:
    """What one label did to each stream: the e-value, and whether the alarm was raised or cleared."""

    e_value: np.ndarray
    raised: np.ndarray
    cleared: np.ndarray


@dataclass
class DetectorState:
    """The detector's sufficient state for ``streams`` independent streams (arrays, leading axis = stream)."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    streams: int = 1
    gap_sum: np.ndarray = None
    weight: np.ndarray = None
    global_gap_sum: np.ndarray = None
    global_weight: np.ndarray = None
    log_statistic: np.ndarray = None
    alarmed: np.ndarray = None
    alternative: np.ndarray = None
    log_clear: np.ndarray = None
    since_alarm: np.ndarray = None
    n: np.ndarray = None

    def __post_init__(self):
        m, k = len(self.config.half_lives), self.config.n_bins
        shapes = {"gap_sum": (self.streams, m, k), "weight": (self.streams, m, k), "global_gap_sum": (self.streams, m),
                  "global_weight": (self.streams, m), "log_statistic": (self.streams, m),
                  "alternative": (self.streams, k)}
        for name in _FIELDS:
            dtype = bool if name == "alarmed" else np.int64 if name in ("since_alarm", "n") else np.float64
            shape = shapes.get(name, (self.streams,))
            value = getattr(self, name)
            array = np.zeros(shape, dtype) if value is None else np.array(value, dtype=dtype).reshape(shape)
            setattr(self, name, array)

    @property
    def statistic(self) -> np.ndarray:
        """max over memories m of S_t^(m) / M, the e-detector of each stream: it reaches A when one of
        the M component detectors reaches M A (so P(false alarm within n) <= M n / (M A) = n / A)."""
        top = self.log_statistic.max(axis=1) - np.log(len(self.config.half_lives))
        return np.exp(np.minimum(top, 700.0))

    @property
    def clear_statistic(self) -> np.ndarray:
        """K_t, the evidence that calibration has returned (meaningful while alarmed)."""
        return np.exp(np.minimum(self.log_clear, 700.0))

    def gaps(self, bins: np.ndarray | None = None) -> np.ndarray:
        """(streams, memories, bins): the recent accuracy - confidence around each bin (a Gaussian kernel
        of ``bandwidth`` on the log-odds scale over neighbouring bins), shrunk towards the all-bin gap;
        with ``bins`` (one per stream), only at those bins: (streams, memories)."""
        prior = self.config.prior_labels
        overall = self.global_gap_sum / (self.global_weight + prior)
        kernel = _kernel(self.config)
        if bins is None:
            return (self.gap_sum @ kernel + prior * overall[..., None]) / (self.weight @ kernel + prior)
        column = kernel[:, bins].T[:, None, :]                                # (streams, 1, bins)
        return (((self.gap_sum * column).sum(-1) + prior * overall)
                / ((self.weight * column).sum(-1) + prior))

    def step(self, confidence, correct) -> Step:
        """Fold in one label per stream (arrays of length ``streams``); see the module docstring."""
        cfg = self.config
        c = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
        y = np.asarray(correct, dtype=np.float64)
        rows = np.arange(self.streams)
        b = np.searchsorted(cfg.edges, c, side="left")
        gap = self.gaps(b)                                   # (streams, memories)
        cm = c[:, None]
        accuracy = np.clip(cm + gap, 0.0, 1.0)
        boundary = np.clip(cm + np.sign(gap) * cfg.tolerance, 1e-3, 1 - 1e-3)
        outside = np.abs(gap) > cfg.tolerance
        bet = np.where(outside, (accuracy - boundary) / (boundary * (1 - boundary)), 0.0)
        cap = np.where(bet > 0, cfg.max_bet / (cm + cfg.tolerance), cfg.max_bet / (1 - cm + cfg.tolerance))
        bet = np.clip(bet, -cap, cap)
        e_value = 1.0 + bet * (y - c)[:, None] - np.abs(bet) * cfg.tolerance

        self.log_statistic = np.maximum(self.log_statistic, 0.0) + np.log(e_value)
        crossed = self.log_statistic >= cfg.log_raise
        raised = ~self.alarmed & crossed.any(axis=1)

        alternative = np.clip(c + cfg.clear_shrink * self.alternative[rows, b], 1e-3, 1 - 1e-3)
        null = np.clip(c, 1e-3, 1 - 1e-3)
        log_ratio = np.where(y > 0.5, np.log(null / alternative), np.log((1 - null) / (1 - alternative)))
        self.since_alarm = np.where(self.alarmed, self.since_alarm + 1, 0)
        self.log_clear = np.where(self.alarmed, np.maximum(self.log_clear, 0.0) + log_ratio, 0.0)
        cleared = (self.alarmed & (self.log_clear >= np.log(cfg.clear_threshold))
                   & (self.since_alarm >= cfg.min_clear_labels))

        decay = cfg.decay
        residual = (y - c)[:, None]
        self.gap_sum[rows, :, b] = self.gap_sum[rows, :, b] * decay + residual
        self.weight[rows, :, b] = self.weight[rows, :, b] * decay + 1.0
        global_decay = decay ** (1.0 / cfg.n_bins)
        self.global_gap_sum = self.global_gap_sum * global_decay + residual
        self.global_weight = self.global_weight * global_decay + 1.0
        self.n += 1

        if raised.any():
            estimate = self.gaps()[raised].mean(axis=1)
            self.alternative[raised] = np.sign(estimate) * np.maximum(np.abs(estimate) - cfg.tolerance, 0.0)
        self.alarmed = (self.alarmed | raised) & ~cleared
        self.log_clear = np.where(cleared | raised, 0.0, self.log_clear)
        self.since_alarm = np.where(cleared | raised, 0, self.since_alarm)
        self.log_statistic = np.where(cleared[:, None], 0.0, self.log_statistic)
        return Step(e_value, raised, cleared)

    def regions(self) -> list[dict]:
        """Per bin of a single-stream state: confidence range, labels weighed (long memory) and the
        estimated gap accuracy - confidence (mean over memories), for reports."""
        edges = [0.0, *self.config.edges, 1.0]
        gaps, weight = self.gaps()[0].mean(axis=0), self.weight[0, -1]
        return [{"confidence_low": lo, "confidence_high": hi, "weight": float(w), "gap": float(g)}
                for lo, hi, w, g in zip(edges[:-1], edges[1:], weight, gaps)]

    def worst_region(self) -> tuple[float, tuple[float, float]]:
        """(gap, (confidence low, high)) of the region of a single-stream state furthest beyond the
        tolerance, among those with labels."""
        regions = [r for r in self.regions() if r["weight"] >= 1.0] or self.regions()
        worst = max(regions, key=lambda r: abs(r["gap"]))
        return worst["gap"], (worst["confidence_low"], worst["confidence_high"])

    def to_dict(self) -> dict:
        """JSON form of a single-stream state (the service persists one per model and calibration version)."""
        if self.streams != 1:
            raise ValueError("only a single-stream state is persisted")
        out = {"format": FORMAT, "tolerance": self.config.tolerance, "threshold": self.config.threshold}
        out.update({name: getattr(self, name).ravel().tolist() for name in _FIELDS})
        return out

    @classmethod
    def from_dict(cls, data: dict, config: DetectorConfig) -> "DetectorState":
        """Inverse of ``to_dict``. State saved under another format, tolerance or threshold (an older
        service, a changed configuration) is not this detector's evidence: a fresh state is returned."""
        if (not isinstance(data, dict) or data.get("format") != FORMAT or data.get("tolerance") != config.tolerance
                or data.get("threshold") != config.threshold):
            return cls(config)
        return cls(config, 1, **{name: data[name] for name in _FIELDS})


_KERNELS: dict = {}


def _kernel(config: DetectorConfig) -> np.ndarray:
    """(bins, bins) Gaussian weights between bin centres on the log-odds scale."""
    key = (config.edges, config.bandwidth)
    if key not in _KERNELS:
        logits = np.log(np.asarray(config.edges) / (1 - np.asarray(config.edges)))
        step = np.diff(logits).mean() if len(logits) > 1 else 1.0
        centres = np.concatenate([[logits[0] - step / 2], (logits[1:] + logits[:-1]) / 2, [logits[-1] + step / 2]])
        _KERNELS[key] = np.exp(-0.5 * ((centres[:, None] - centres[None, :]) / config.bandwidth) ** 2)
    return _KERNELS[key]
