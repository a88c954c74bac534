"""Split conformal classification: prediction sets that contain the true label with a chosen probability.

Given n calibration examples (x_i, y_i), exchangeable with a test example (x, y), and a score s(x, y) that is
large when y is an unlikely label for x, the set C(x) = {k : s(x, k) <= q}, with q the ceil((n + 1)(1 - alpha))-th
smallest calibration score s_i = s(x_i, y_i), contains y with probability at least 1 - alpha (Vovk, Gammerman &
Shafer 2005; Lei et al. 2018). The probability is over the calibration and the test example together: the
guarantee is marginal, and it needs exchangeability, so it does not survive a shift between calibration and
serving. From probabilities (N, K) of a model trained on other data, this package computes:

- the LAC, APS (Romano et al. 2020) and RAPS (Angelopoulos et al. 2021) scores of given labels, randomized or not
  (``conformity_scores``, module ``scores``);
- the finite-sample quantile (``conformal_quantile``), or one per class (``classwise_quantiles``, Mondrian), in
  ``quantile``;
- prediction sets (N, K) for a threshold (``prediction_sets``), or each row's ranked labels with its set size
  (``ranked_sets``, what a server lists), in ``sets``;
- conformal p-values per class (``SplitConformal.p_values``), whose level sets {k : p_k > alpha} are the prediction
  sets at every alpha, so the sets for different coverage levels are nested;
- the weighted quantiles of label shift (``label_shift_quantiles``, ``label_shift_thresholds``, module ``weighted``;
  Podkopaev & Ramdas 2021), which keep the coverage when the class priors move;
- ``SplitConformal`` (``calibrator``), the fitted calibrator.

The private ``_ranking`` ranks the rows (by keys and block sums at many classes); ``_checks`` checks the inputs.

Conventions shared by every function:

- **Probabilities** pass ``calibkit.validation.check_probs``: rows summing to 1 within 1e-4 are taken as they are,
  others are refused rather than renormalised (a row that does not sum to 1 usually means logits or the wrong
  axis, which a renormalisation would hide). A 1-D input is a binary problem, the two columns [1 - p, p].
- **Ties.** Labels of equal probability share one score, so they are in or out of a set together and no result
  depends on the order in which a sort leaves them.
- **Tolerance.** A score within ``SCORE_ATOL`` = 1e-8 of the threshold counts as equal to it, as MAPIE's
  ``EPSILON``: the same mass summed in another order (0.6 + 0.2 against 0.5 + 0.3) differs in the last bits.
- **Randomness** enters only through the argument ``u``: an array of N uniform draws, one per row, or a numpy
  ``Generator`` / ``RandomState`` to draw them from. ``u=np.random.RandomState(seed)`` draws what MAPIE draws
  with ``random_state=seed``.

>>> import numpy as np
>>> probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
>>> scores = conformity_scores(probs, [0, 1, 1, 2], "aps")  # the mass down to the true label
>>> scores.round(2).tolist()
[0.7, 0.75, 0.6, 1.0]
>>> q = conformal_quantile(scores, alpha=0.4)  # the ceil(5 * 0.6) = 3rd smallest
>>> q
0.75
>>> prediction_sets(probs, q, "aps").astype(int).tolist()  # down to the first label whose mass reaches q
[[1, 1, 0], [1, 1, 0], [0, 1, 1], [1, 1, 0]]
"""

# ``name as name``: private names the tests reach through the package, re-exported.
from calibkit.conformal._checks import _check_probs as _check_probs
from calibkit.conformal._ranking import _block_sizes as _block_sizes
from calibkit.conformal._ranking import _KeyRanking as _KeyRanking
from calibkit.conformal.calibrator import SplitConformal
from calibkit.conformal.quantile import classwise_quantiles, conformal_quantile, quantile_rank
from calibkit.conformal.scores import (
    METHODS,
    SCORE_ATOL,
    conformity_scores,
    floor_scores,
    pick_k_reg,
)
from calibkit.conformal.sets import _count_at_or_above as _count_at_or_above
from calibkit.conformal.sets import prediction_sets, ranked_sets
from calibkit.conformal.weighted import label_shift_quantiles, label_shift_thresholds

__all__ = [
    "METHODS",
    "SCORE_ATOL",
    "SplitConformal",
    "classwise_quantiles",
    "conformal_quantile",
    "conformity_scores",
    "floor_scores",
    "label_shift_quantiles",
    "label_shift_thresholds",
    "pick_k_reg",
    "prediction_sets",
    "quantile_rank",
    "ranked_sets",
]
