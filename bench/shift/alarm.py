"""The shift benchmark's label-shift alarm rows (``calibkit.label_shift_alarm``,
``LabelShiftAlarmConfig.for_reference`` of each source's validation reference), on streams of ``ALARM_LENGTH``
predictions drawn as the windows are, the shift from the first prediction on: false alarms under no shift against n /
A + epsilon (decision 0032) at each of ``THRESHOLDS``, the delay under label shift against an oracle told the new
priors (Page 1954; Lorden 1971), and the firing under covariate shift. The page (``render``) says what each figure
means."""

from __future__ import annotations

import numpy as np

from bench.common import clopper_pearson
from bench.shift.streams import ALPHAS, Pool, Source, draw_windows, share
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


def alarm_rows(source: Source, streams: int, length: int, seed: int) -> list[dict]:
    """The source's rows: no shift at each of ``THRESHOLDS``; label and covariate shifts at the default threshold."""
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
        row: dict = {
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
                "raised_left_band": share(raised[band].sum(), band.sum()),
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
