"""The shift benchmark's sources (the page lists them) and streams: pools of served probabilities and labels per
input condition, and windows drawn from them with or without new class priors.

A window of n rows is drawn from a pool with replacement: under no shift uniformly; under label shift pi_t ~
Dirichlet(alpha 1_K), class counts ~ Multinomial(n, pi_t), each class's rows from that class's rows of the pool, so
p(x | y) is the pool's and only the priors move. ``cifar-like``'s covariate shift goes through its generator: the
model sees z + e, e ~ N(0, (``NOISE_STEP`` s)^2 I) at severity s, while the label follows z.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.common import CIFAR_LIKE
from calibkit.manifest import LabelShiftReference
from calibkit.synthetic import TrafficShape
from calibkit.temperature import softmax

SEVERITIES = (1, 2, 3, 4, 5)
ALPHAS = (0.1, 1.0, 10.0)
#: The severity of the covariate shift in the rows that shift both inputs and priors.
BOTH_SEVERITY = 3
#: Corrupted copies of the digits test split per corruption and severity (their noise differs).
CORRUPTION_DRAWS = 2
SYNTHETIC = TrafficShape("synthetic", 5, 3.0, class_offset=1.0)
#: The standard deviation of the CIFAR-like model's input noise per step of severity, in logits.
NOISE_STEP = 0.3
#: Rows of each synthetic pool, of its labelled reference, and of the sample that gives its true source priors.
POOL_ROWS, REFERENCE_ROWS, PRIOR_ROWS = 100_000, 2_000, 400_000


@dataclass(frozen=True)
class Pool:
    """Served probabilities (N, K) and labels (N,) under one input condition, with each class's row indices."""

    probs: np.ndarray
    labels: np.ndarray
    by_class: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        k = self.probs.shape[1]
        object.__setattr__(self, "by_class", [np.flatnonzero(self.labels == c) for c in range(k)])


@dataclass(frozen=True)
class Source:
    """A model: its labelled reference rows, its source priors (``true_priors``) and a pool per input condition."""

    name: str
    reference_probs: np.ndarray
    reference_labels: np.ndarray
    true_priors: np.ndarray
    pools: dict[str, Pool]

    @property
    def reference(self) -> LabelShiftReference:
        return LabelShiftReference.from_rows(self.reference_probs, self.reference_labels)


@dataclass(frozen=True)
class Scenario:
    """A row's shift: the pool's condition and the target priors' Dirichlet concentration (None: no label shift)."""

    shift: str
    condition: str = "clean"
    alpha: float | None = None


def scenarios(source: Source) -> list[Scenario]:
    """No shift; label shift at each alpha; covariate shift at each severity the source has; both at once."""
    out = [Scenario("none")]
    out += [Scenario("label", alpha=a) for a in ALPHAS]
    severities = [s for s in SEVERITIES if f"severity {s}" in source.pools]
    out += [Scenario("covariate", f"severity {s}") for s in severities]
    if BOTH_SEVERITY in severities:
        out += [Scenario("both", f"severity {BOTH_SEVERITY}", a) for a in ALPHAS]
    return out


@dataclass(frozen=True)
class Windows:
    """``streams`` windows of n rows: row indices into the pool, and each window's target priors."""

    index: np.ndarray
    priors: np.ndarray


def draw_windows(pool: Pool, alpha: float | None, streams: int, n: int, seed: int) -> Windows:
    """Seeded windows from ``pool``: uniform rows, or class counts from Dirichlet(alpha) priors and rows by class."""
    rng = np.random.default_rng(seed)
    k = pool.probs.shape[1]
    if alpha is None:
        frequencies = np.bincount(pool.labels, minlength=k) / len(pool.labels)
        return Windows(rng.integers(0, len(pool.labels), (streams, n)), np.tile(frequencies, (streams, 1)))
    priors = rng.dirichlet(np.full(k, alpha), streams)
    index = np.empty((streams, n), np.int64)
    for s in range(streams):
        counts = rng.multinomial(n, priors[s])
        parts = [rng.choice(pool.by_class[c], counts[c]) for c in range(k) if counts[c]]
        index[s] = rng.permutation(np.concatenate(parts))
    return Windows(index, priors)


def share(part: float, whole: float) -> float | None:
    """``part`` / ``whole``, None where ``whole`` is not positive."""
    return float(part / whole) if whole > 0 else None


def digits_source() -> Source:
    """The committed default model on the digits splits (the module docstring)."""
    from bench.common import digits_model
    from training.data import available_corruptions, corrupt, load_digits_splits

    probs, splits = digits_model(normalized=True), load_digits_splits()
    reference = probs(splits.val.x)
    pools = {"clean": Pool(probs(splits.test.x), splits.test.y)}
    copies = CORRUPTION_DRAWS * len(available_corruptions())
    for severity in SEVERITIES:
        x = np.concatenate(
            [
                corrupt(splits.test.x, kind, severity, seed=draw)
                for kind in available_corruptions()
                for draw in range(CORRUPTION_DRAWS)
            ]
        )
        pools[f"severity {severity}"] = Pool(probs(x), np.tile(splits.test.y, copies))
    mean = reference.mean(axis=0)
    return Source("digits", reference, splits.val.y, mean / mean.sum(), pools)


def synthetic_source(
    shape: TrafficShape, seed: int, noise: Callable[[int], float] | None = None, rows: int = POOL_ROWS
) -> Source:
    """A calibrated synthetic source from ``shape``; with ``noise``, a pool per severity s whose served probabilities
    are softmax(z + e), e ~ N(0, noise(s)^2 I), labels still drawn from softmax(z)."""
    rng = np.random.default_rng(seed)
    z, y_reference = shape.logits(rng, (REFERENCE_ROWS,))
    reference = softmax(z)
    z, y_pool = shape.logits(rng, (rows,))
    pools = {"clean": Pool(softmax(z), y_pool)}
    if noise is not None:
        for severity in SEVERITIES:
            seen = z + rng.normal(0.0, noise(severity), z.shape)
            pools[f"severity {severity}"] = Pool(softmax(seen), y_pool)
    zp, _ = shape.logits(rng, (PRIOR_ROWS,))
    true = softmax(zp).mean(axis=0)
    return Source(shape.name, reference, y_reference, true, pools)


def sources(seed: int, pool_rows: int = POOL_ROWS) -> list[Source]:
    """The three sources, seeded."""
    return [
        digits_source(),
        synthetic_source(CIFAR_LIKE, seed, lambda s: NOISE_STEP * s, pool_rows),
        synthetic_source(SYNTHETIC, seed + 1, None, pool_rows),
    ]
