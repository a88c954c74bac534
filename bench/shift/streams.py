"""The shift benchmark's sources and streams: pools of served probabilities and labels, and windows drawn from them
with or without new class priors.

A source is a model with its labelled reference rows (``LabelShiftReference``, the validation split) and pools of
served rows under each input condition:

- ``digits``: the committed default model (``artifacts/digits-lenet5/1``, onnxruntime) on the digits test split
  (359 images), clean, and under each severity 1-5 with every corruption of ``training.data.corruptions`` pooled
  (``CORRUPTION_DRAWS`` noisy copies each). Its reference is the validation split.
- ``cifar-like``: ``calibkit.synthetic``'s CIFAR-like traffic (10 classes, logits N(0, 2.5^2)), labels drawn from
  softmax(z), so the served softmax(z) is its true posterior. Its covariate shift goes through its generator: the
  model sees z + e with e ~ N(0, (``NOISE_STEP`` s)^2 I) at severity s while the label still follows z, so its inputs
  lose information and its probabilities become over-confident, as a corrupted image's do.
- ``synthetic``: a 5-class source with known true posteriors and source priors other than uniform (class 0's logit
  raised by ``SYNTHETIC.class_offset``), the case where EM's source priors matter.

A window of n rows is drawn from a pool with replacement: under no shift uniformly; under label shift its target
priors pi_t ~ Dirichlet(alpha 1_K), its class counts ~ Multinomial(n, pi_t), and each class's rows from that class's
rows of the pool, so p(x | y) is the pool's and only the priors move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from calibkit.manifest import LabelShiftReference
from calibkit.synthetic import TrafficShape
from calibkit.temperature import softmax

SEVERITIES = (1, 2, 3, 4, 5)
ALPHAS = (0.1, 1.0, 10.0)
#: The severity of the covariate shift in the rows that shift both inputs and priors.
BOTH_SEVERITY = 3
#: Corrupted copies of the digits test split per corruption and severity (their noise differs).
CORRUPTION_DRAWS = 2
CIFAR_LIKE = TrafficShape("cifar-like", 10, 2.5)
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
    """A model: its labelled reference rows, the source priors its posteriors assume (``true_priors``: exact for the
    synthetic sources, the reference's mean probabilities for digits) and a pool per input condition (``clean``,
    ``severity 1`` ...)."""

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
    """A row's shift: the pool's condition and the Dirichlet concentration of the target priors (None: no label
    shift)."""

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
    """``streams`` windows of n rows: row indices into the pool (streams, n), and each window's target priors
    (streams, K): the Dirichlet draw under label shift, the pool's label frequencies otherwise."""

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


def digits_source() -> Source:
    """The committed default model on the digits splits: the validation split as reference, the test split clean and
    corrupted as pools."""
    from bench.common import digits_model
    from training.data import available_corruptions, corrupt, load_digits_splits

    model = digits_model()
    splits = load_digits_splits()

    def probs(x: np.ndarray) -> np.ndarray:
        p = model(x)
        return p / p.sum(axis=1, keepdims=True)

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
    """A calibrated synthetic source: reference and clean pool from ``shape``; with ``noise``, a pool per severity
    whose served probabilities are softmax(z + e), e ~ N(0, noise(s)^2 I), labels still drawn from softmax(z)."""
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
