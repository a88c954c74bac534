"""Moved to ``calibkit.conformal.adaptive``; this module re-exports its names for one release, with a warning."""

import warnings

from calibkit.conformal.adaptive import (  # noqa: F401
    DEFAULT_METHOD,
    DEFAULT_RELEASE,
    DEFAULT_SPAN,
    DEFAULT_STEP,
    STATE_FORMAT,
    LogQuantileTracker,
    aci_thresholds,
    check_misses,
    log_scores,
    log_thresholds,
    misses_of,
    score_range,
    served_ranked_sets,
    track,
)

warnings.warn(
    "calibkit.adaptive_conformal is now calibkit.conformal.adaptive; the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
