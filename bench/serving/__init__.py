"""The serving benchmark (``python -m bench.serving``, part of ``make bench``): ``measure`` runs the servers and
the load, ``goals`` judges the results, ``render`` prints them."""
