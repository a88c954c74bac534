# Everything installs into ./.venv. For training and tests torch is installed first and pinned
# (TORCH_SPEC), because a bare `torch` requirement on a machine without it pulls several GB of CUDA
# packages; serving never needs torch.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# The optional torchvision venv: torchvision 0.29.1 imports only beside torch 2.14.1, a CUDA build (~5.5 GB, it
# runs on the CPU too), so it never enters .venv.
VISION_VENV ?= .venv-vision
VISION_SPEC ?= torch==2.14.1 torchvision==0.29.1
VPY := $(VISION_VENV)/bin/python

.PHONY: help run serve demo tools proto conformance shift-refs cbpe lint test test-fast vision test-vision bench bench-alarm bench-conformal bench-engine bench-shift bench-store artifacts upgrade-artifact study simulate k8s-rules clean

## help: every target and what it does (the comments above each rule)
help:
	@awk '/^## [a-z0-9-]+:/ { if (text) print text; sub(/^## /, ""); text = $$0; next } \
		/^## / { sub(/^## /, " "); text = text $$0; next } { if (text) print text; text = "" }' $(firstword $(MAKEFILE_LIST))

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(filter service,$*),,$(PIP) install -q $(TORCH_SPEC))
	$(PIP) install -q -e '.[$*]'
	touch $@

## run: install the training extra and run the main job on the embedded default: train LeNet-5 on
## digits, fit temperature scaling, evaluate (test, corruptions, OOD) and export the next artifact version
run: $(VENV)/.installed-training
	$(PY) -m training run

## artifacts: regenerate the committed default artifact artifacts/digits-lenet5/1
artifacts: $(VENV)/.installed-training
	$(PY) -m training run --version 1 --overwrite --run-dir runs/default --no-progress

# The artifact directory that upgrade-artifact upgrades.
ARTIFACT ?= artifacts/digits-lenet5/1

## upgrade-artifact: add the entries newer than an artifact (ARTIFACT, default artifacts/digits-lenet5/1) to it: the
## manifest's label_shift and conformal.json's per-class scores, computed again from its model and split, nothing changed
upgrade-artifact: $(VENV)/.installed-training
	$(PY) scripts/upgrade_artifact.py $(ARTIFACT)

## study: the loss comparison of Mukhoti et al. (Table 1) on digits over 5 seeds with the papers' protocol
## (full schedule, final model), written to docs/study/ (protocol and reading: docs/study/protocol.md)
study: $(VENV)/.installed-training
	$(PY) -m training study --no-progress

## serve: install the service extra and serve artifacts/ on http://127.0.0.1:8000
serve: $(VENV)/.installed-service
	$(PY) -m service

## demo: serve the default artifact, stream in-distribution then corrupted digits with labels, watch
## the alarm fire, recalibrate, and watch ECE come back down (plot in runs/demo/)
demo: $(VENV)/.installed-dev
	$(PY) scripts/demo.py

## tools: the Debian tools the tests and benchmarks use (docker-compose, prometheus/promtool, chromium, wrk, h2load), when missing
tools:
	scripts/install-tools.sh

# The protocol owners' own clients, each in a venv of its own: kserve and mlserver pin starlette versions that
# neither the service's venv nor each other take.
KSERVE_SPEC ?= kserve==0.21.0
MLSERVER_SPEC ?= mlserver==1.7.1 httpx
# Only the suite runs these venvs and the label-shift references', and it writes the bytecode of what it imports
# (SUITE_ENV): their installs skip compiling every module of every package.
REF_INSTALL := -m pip --disable-pip-version-check install -q --no-compile
.venv-%/.installed:
	test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python $(REF_INSTALL) $($(shell echo $* | tr a-z A-Z)_SPEC)
	touch $@

# The references of the label-shift parity tests (tests/calibkit/test_label_shift_parity.py), in a venv of their own
# beside the pins of .venv: abstention (Alexandari et al.'s EM and BCTS, last released in 2020) and labelshift (BBSE,
# EM and BCTS). labelshift's package __init__ imports its training stack (torchvision, transformers, timm), and no
# torchvision on the registries matches the CPU torch: it is installed without its dependencies, and
# tests/conformance/label_shift_refs.py loads its estimator modules without that __init__, beside what they import
# (torch, cvxpy, scikit-learn, pyyaml).
SHIFT_REFS_SPEC ?= abstention==0.1.3.1 cvxpy==1.9.3 scikit-learn pyyaml $(TORCH_SPEC)
LABELSHIFT_SPEC ?= labelshift==0.2.11
.venv-shift-refs/.installed:
	test -x .venv-shift-refs/bin/python || $(PYTHON) -m venv .venv-shift-refs
	.venv-shift-refs/bin/python $(REF_INSTALL) $(SHIFT_REFS_SPEC)
	.venv-shift-refs/bin/python $(REF_INSTALL) --no-deps $(LABELSHIFT_SPEC)
	touch $@

## shift-refs: the venv of the label-shift references (abstention, labelshift) the parity tests run
shift-refs: .venv-shift-refs/.installed

# NannyML's CBPE, the peer of make bench-shift, in a venv of its own that only the benchmark needs (nannyml does not
# install beside .venv's pins, and imports statsmodels without declaring it).
CBPE_SPEC ?= nannyml==0.13.1 statsmodels==0.15.0
.venv-cbpe/.installed:
	test -x .venv-cbpe/bin/python || $(PYTHON) -m venv .venv-cbpe
	.venv-cbpe/bin/python -m pip --disable-pip-version-check install -q $(CBPE_SPEC)
	touch $@

## cbpe: the venv of NannyML's CBPE, which make bench-shift runs beside the service's estimates
cbpe: .venv-cbpe/.installed

## proto: regenerate service/serving/protocol's Python modules from grpc_predict_v2.proto (grpcio-tools)
proto: $(VENV)/.installed-dev
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. service/serving/protocol/grpc_predict_v2.proto

## conformance: the venvs of kserve's client and MLServer's types, which the protocol conformance tests run
conformance: .venv-kserve/.installed .venv-mlserver/.installed

## lint: the formatting check and lint of ruff (120 columns) over the tree, and mypy on calibkit and service
lint: $(VENV)/.installed-dev
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy

# The suite's worker processes (pytest-xdist; each gets its own PostgreSQL, tests/conftest.py); 0 runs it in one.
# Three on two cores: many tests wait on the processes they start, and a third worker fills those waits.
TEST_WORKERS ?= 3
# The suite writes bytecode caches (__pycache__, ignored by git) even where the environment turns them off: each
# worker's collection and each of the many processes its tests start would otherwise compile the sources again.
SUITE_ENV := PYTHONDONTWRITEBYTECODE=

# What the suite needs, built side by side (make -j): an install waits on the disk for much of its time, so one at a
# time leaves cores idle.
SUITE_NEEDS := $(VENV)/.installed-dev tools conformance shift-refs

## test: install the dev extra, the tools, the conformance venvs and the label-shift references (side by side), and
## run the test suite on TEST_WORKERS (3) pytest-xdist workers
test:
	$(MAKE) --no-print-directory -j 4 --output-sync=target $(SUITE_NEEDS)
	$(SUITE_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --doctest-modules calibkit training tests

## test-fast: the fast tier, without the tools: everything but the tests marked e2e (PostgreSQL, Chromium,
## docker-compose, promtool/prometheus, hadolint, wrk, server processes, long training and benchmark runs)
test-fast: $(VENV)/.installed-dev
	$(SUITE_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --doctest-modules -m "not e2e" calibkit training tests

$(VISION_VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VISION_VENV)
	$(VPY) -m pip --disable-pip-version-check install -q $(VISION_SPEC)
	$(VPY) -m pip --disable-pip-version-check install -q -e '.[vision,test]'
	touch $@

## vision: the optional [vision] venv .venv-vision (torch 2.14.1 + torchvision 0.29.1, the project with its training
## and service extras): torchvision:* models fine-tuned from local weights files, --augment
vision: $(VISION_VENV)/.installed

## test-vision: the torchvision tests (tests/vision) in .venv-vision: fine-tuning from a local weights file, ONNX
## export and serving, the augmentation, the seed-000 recipe on a generated CIFAR-10 file
test-vision: $(VISION_VENV)/.installed
	$(VPY) -m pytest -q tests/vision

## bench: every benchmark of bench/registry.py in turn, each timed (tables on stdout, bench/results/*.json,
## docs/benchmarks.md with the run times, docs/alarm_benchmark.md, docs/conformal_benchmark.md,
## docs/engine_benchmark.md, docs/shift_benchmark.md, docs/store_benchmark.md, and README.md's figures table); about
## 2 hours, most of it the alarm's simulations
bench: $(VENV)/.installed-dev tools cbpe
	$(PY) -m bench

## bench-alarm: make bench's alarm entry alone: false alarms, detection and clearing delays on simulated streams,
## covariate shift through /predict, and single-label feedback throughput (docs/alarm_benchmark.md)
bench-alarm: $(VENV)/.installed-dev tools
	$(PY) -m bench --only alarm

## bench-conformal: make bench's conformal entry alone: split conformal prediction sets on exchangeable data
## (coverage against its exact law, set sizes, coverage by set size and class), their cost per batch, adaptive sets
## under shift and the coverage alarm (docs/conformal_benchmark.md)
bench-conformal: $(VENV)/.installed-dev tools
	$(PY) -m bench --only conformal

## bench-shift: make bench's shift entry alone: estimated accuracy and its intervals, EM and BBSE priors, and
## label-shift adaptation against an oracle and NannyML's CBPE, under label and covariate shift
## (docs/shift_benchmark.md)
bench-shift: $(VENV)/.installed-dev cbpe
	$(PY) -m bench --only shift

## bench-engine: make bench's engine entry alone: the engine process's IPC cost against the in-process batcher, and
## a pod of front-ends against one process over JSON and gRPC (docs/engine_benchmark.md)
bench-engine: $(VENV)/.installed-dev tools
	$(PY) -m bench --only engine

## bench-store: make bench's store entry alone: the prediction log on PostgreSQL, compact and partitioned against
## schema version 2: bytes, WAL and server CPU per prediction, expiry and query latency against the log's size, and
## /predict during retention (docs/store_benchmark.md)
bench-store: $(VENV)/.installed-dev
	$(PY) -m bench --only store

## k8s-rules: render deploy/prometheus/alerts.yml as the PrometheusRule of deploy/k8s/prometheus-operator
k8s-rules: $(VENV)/.installed-dev
	$(PY) scripts/k8s_prometheus_rule.py

## simulate: alarm false-alarm rate and detection delay through the real HTTP API (about 5 minutes)
simulate: $(VENV)/.installed-dev
	$(PY) scripts/simulate_shift.py

## clean: remove the venvs, pytest's cache and hypothesis' database
clean:
	rm -rf $(VENV) $(VISION_VENV) .pytest_cache .hypothesis
