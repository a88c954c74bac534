"""calibkit: the calibration math shared by training and serving (numpy + scipy, never torch).

Modules: ``metrics`` (ECE, MCE, AdaECE, classwise ECE, NLL, Brier, ...), ``binning`` (the bin
sums every binned metric is built from), ``stats`` (mergeable ``BinStats``), ``bootstrap``
(confidence intervals), ``temperature`` (temperature scaling), ``calibrators`` (post-hoc
calibrators behind one interface) and ``validation`` (input checks).
"""

__version__ = "0.1.0"
