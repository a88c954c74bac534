"""calibkit: the calibration math shared by training and serving (numpy + scipy, never torch).

Modules: ``metrics`` (ECE, MCE, AdaECE, classwise ECE, NLL, Brier, ...), ``binning`` (the bin sums every binned
metric is built from), ``stats`` (mergeable ``BinStats``), ``bootstrap`` (confidence intervals), ``significance``
(intervals and tests from bin sums), ``temperature`` (temperature scaling), ``calibrators`` (post-hoc calibrators
behind one interface), ``conformal`` (split conformal prediction sets: LAC, APS, RAPS, Mondrian, p-values;
``conformal.adaptive``, ACI and the quantile tracker), ``synthetic`` (predictions of known calibration),
``eprocess`` (the alarms' e-process core), ``coverage_alarm`` (the anytime-valid coverage alarm), ``detector`` and
``alarms`` (the anytime-valid miscalibration alarm), ``drift`` (label-free shift tests), ``estimated_accuracy`` (the
accuracy calibrated probabilities promise, with its Poisson-binomial interval), ``label_shift`` (new class priors
without labels: EM and BBSE, and the prior-adapted probabilities), ``label_shift_alarm`` (the anytime-valid
label-shift alarm on unlabelled predictions), ``manifest`` (the artifact contract), ``plotting`` (reliability
diagrams) and ``validation`` (input checks).
"""

__version__ = "0.1.0"
