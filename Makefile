# Everything installs into ./.venv. torch is installed first and pinned (TORCH_SPEC), because a bare
# `torch` requirement on a machine without it pulls several GB of CUDA packages.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: run test bench clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e '.[$*]'
	touch $@

## run: install the training extra and run the main job on the embedded default (digits)
run: $(VENV)/.installed-training
	$(PY) examples/sklearn_digits_calibration.py

## test: install the dev extra and run the test suite
test: $(VENV)/.installed-dev
	$(PY) -m pytest -q --doctest-modules calibkit tests

## bench: run the benchmarks (each prints a table and writes bench/results/*.json)
bench: $(VENV)/.installed-dev
	$(PY) bench/fit_temperature.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
