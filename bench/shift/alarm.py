"""The shift benchmark's label-shift alarm rows (``calibkit.label_shift_alarm``): false alarms on unshifted streams
against the stated bound, detection delay under label shift against an oracle told the shift, and the firing rate
under covariate shift.

The alarm of each source is ``LabelShiftAlarmConfig.for_reference`` of its validation reference (the
``LabelShiftReference`` behind EM's source priors), with its margins for the reference's own error. A stream is
``ALARM_LENGTH`` predictions drawn with replacement from a pool, as the benchmark's windows are: uniformly (no
shift, covariate shift), or under label shift with priors pi_t ~ Dirichlet(alpha) from the first prediction on.

- **False alarms.** Under no shift the share of streams raised within n predictions is at most n / A + epsilon
  (decision 0032: the detector's bound plus the probability that the reference's margins miss). At the default A
  that bound is about epsilon; a smaller A (``THRESHOLDS``) makes n / A the informative part, and the lowest one
  makes it vacuous, to show how far the statistic stays below what the bound allows.
- **Delay** under label shift: predictions to the first raise (the change at prediction 0), median and quantiles
  among the raised, and the share raised within the horizon. The oracle is told the new priors: the CUSUM of the
  exact log likelihood ratio of a prediction under the new priors, log sum_y w_y p(y | x_t), w = pi_t / pi_s
  (Page 1954; Lorden 1971 shows it is the fastest detector at its false-alarm rate), at the same A. It is not told a
  tolerance, so it also raises on the shifts that the alarm's band holds by design; ``left_band`` is the share of
  streams whose shift moves some class's mean beyond its band (the means from the pool's class-conditional mean
  probabilities), the only ones the alarm is built to raise on.
- **Covariate shift**: the share raised within the horizon on the corrupted pools, which the alarm cannot tell from a
  label shift without labels.
"""

from __future__ import annotations

import numpy as np

from bench.shift.streams import ALPHAS, Pool, Source, draw_windows
from calibkit.label_shift_alarm import DEFAULT_THRESHOLD, LabelShiftAlarmConfig, LabelShiftAlarmState

#: Predictions per stream.
ALARM_LENGTH = 10_000
#: The thresholds of the no-shift rows: the default, one whose bound n / A is informative at ALARM_LENGTH, and one
#: whose bound is vacuous.
THRESHOLDS = (DEFAULT_THRESHOLD, 1e5, 1e3)
#: Predictions folded per call (the state is the same however chunked; this bounds the memory of a call).
CHUNK = 1_000


def first_raise(config: LabelShiftAlarmConfig, probs: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Per stream, the index of the alarm's first raise on ``probs[index[s]]`` (streams, n); -1 where none."""
    state = LabelShiftAlarmState.fresh(config, streams=len(index))
    first = np.full(len(index), -1)
    for start in range(0, index.shape[1], CHUNK):
        state = state.fold(probs[index[:, start : start + CHUNK]])
        fresh = (first < 0) & (state.raises > 0)
        first[fresh] = state.raised_at[fresh]  # a clear needs B's evidence: no second raise within a chunk
    return first


def oracle_raise(probs: np.ndarray, index: np.ndarray, weights: np.ndarray, threshold: float) -> np.ndarray:
    """Per stream, the first index at which the CUSUM of log sum_y w_y p(y | x_t) (weights (streams, K)) reaches log
    ``threshold``; -1 where it does not (Page 1954)."""
    streams, n = index.shape
    log_threshold = np.log(threshold)
    cusum = np.zeros(streams)
    first = np.full(streams, -1)
    for start in range(0, n, CHUNK):
        ratio = np.log(np.einsum("snk,sk->sn", probs[index[:, start : start + CHUNK]], weights))
        for i in range(ratio.shape[1]):
            cusum = np.maximum(cusum, 0.0) + ratio[:, i]
            first[(first < 0) & (cusum >= log_threshold)] = start + i
        if np.all(first >= 0):
            break
    return first


def left_band(config: LabelShiftAlarmConfig, pool: Pool, priors: np.ndarray) -> np.ndarray:
    """Per stream, whether the mean probabilities of the stream's law, sum_y E[p | y] pi_t(y), leave the band in some
    class (E[p | y] the pool's mean probabilities of class y)."""
    k = pool.probs.shape[1]
    conditional = np.stack([pool.probs[pool.by_class[y]].mean(axis=0) for y in range(k)])  # (K label, K prob)
    means = priors @ conditional
    return np.any((means > config.upper) | (means < config.lower), axis=1)


def _quantiles(values: np.ndarray) -> list[float] | None:
    return None if len(values) == 0 else [float(q) for q in np.quantile(values, [0.1, 0.5, 0.9])]


def alarm_rows(source: Source, streams: int, length: int, seed: int, clopper_pearson) -> list[dict]:
    """The source's rows: no shift at each of ``THRESHOLDS``; label shift at each alpha and covariate shift at each
    severity, at the default threshold."""
    reference = source.reference
    rows = []
    pool = source.pools["clean"]
    cases: list[tuple[str, str, float | None, float]] = [("none", "clean", None, a) for a in THRESHOLDS]
    cases += [("label", "clean", a, DEFAULT_THRESHOLD) for a in ALPHAS]
    cases += [("covariate", c, None, DEFAULT_THRESHOLD) for c in source.pools if c != "clean"]
    for shift, condition, alpha, threshold in cases:
        seed += 1
        config = LabelShiftAlarmConfig.for_reference(reference, threshold=threshold)
        pool = source.pools[condition]
        windows = draw_windows(pool, alpha, streams, length, seed)
        first = first_raise(config, pool.probs, windows.index)
        raised = first >= 0
        delays = first[raised] + 1.0
        row = {
            "source": source.name,
            "shift": shift,
            "condition": condition,
            "alpha": "" if alpha is None else alpha,
            "threshold": threshold,
            "streams": streams,
            "length": length,
            "raised": int(raised.sum()),
            "raised_share": float(raised.mean()),
            "raised_ci": clopper_pearson(int(raised.sum()), streams),
            "bound": min(1.0, length / threshold + config.epsilon),
            "delay": _quantiles(delays),
            "left_band": float(left_band(config, pool, windows.priors).mean()),
        }
        if alpha is not None:
            weights = windows.priors / source.true_priors
            oracle = oracle_raise(pool.probs, windows.index, weights, threshold)
            band = left_band(config, pool, windows.priors)
            row |= {
                "oracle_share": float((oracle >= 0).mean()),
                "oracle_delay": _quantiles(oracle[oracle >= 0] + 1.0),
                "raised_left_band": _share(raised[band].sum(), band.sum()),
                "delay_left_band": _quantiles(first[raised & band] + 1.0),
                "oracle_delay_left_band": _quantiles(oracle[(oracle >= 0) & band] + 1.0),
            }
        rows.append(row)
        print(
            f"alarm {source.name} {shift} {condition} {row['alpha']} A={threshold:g}: raised {row['raised']}/{streams}"
            + (f", median delay {row['delay'][1]:.0f}" if row["delay"] else ""),
            flush=True,
        )
    return rows


def _share(part, whole) -> float | None:
    return float(part / whole) if whole > 0 else None
