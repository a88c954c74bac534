"""The benchmark of the miscalibration alarm (``python -m bench.alarm``) and what it is measured with.

``traffic`` draws synthetic predictions of known calibration, ``simulation`` runs the detector of
``calibkit.detector`` on many such streams at once, and ``oracle`` is the yardstick: a CUSUM told the shift.
They serve the benchmark, the tests and the scripts, never training or serving, so they live here, not in calibkit.
"""
