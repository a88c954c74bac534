"""The benchmark of split conformal prediction sets (``python -m bench.conformal``): coverage on exchangeable data
against its exact law, set sizes and coverage by set size, and the cost per batch, of ``calibkit.conformal``."""
