# Two commands matter: `make demo` and `make test`. Everything else is a step of theirs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STATE ?= .devcluster
PYTEST_ARGS ?=
# The end-to-end tests mostly wait (on the scheduler, the kubelet's own timeouts, a plugin's
# restart): `make test` runs them in TEST_WORKERS pytest-xdist processes, each with its own
# control planes, a module's tests kept on one worker (their module fixtures are shared).
# Measured on 2 cores: 15 min 40 s serial, 8 min 40 s with 2 workers, 6 min with 3 (the
# CPUs 60% busy). TEST_WORKERS=0 runs them in this process, one by one.
TEST_WORKERS ?= 3
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope)
# The Kubernetes line (dradriver/k8s/lines.py; tools/controlplane builds each from its Go
# modules): K8S=1.35 make demo, make cluster-up, make e2e. Unset, the card's line, 1.34.
K8S ?= 1.34
export K8S
LINES := 1.34 1.35 1.36 1.37
# `make test` runs the whole suite on the card's line and on the newest, and the
# end-to-end tests that exercise the DRA API and the kubelet (pytest -m lines) on the
# lines between.
WHOLE_SUITE_LINES := 1.34 1.37
DRA_TEST_LINES := 1.35 1.36
# kind runs the newest line (deploy/kind/cluster.yaml sets no feature gate: 1.36 made
# what the driver builds on beta and on by default).
KIND_K8S ?= $(lastword $(LINES))
kind-demo kind-down kind-test: K8S = $(KIND_K8S)

.PHONY: all venv bytecode controlplane hollow-node lines cdi-tool nvcdi helm kueue prometheus chromium proto schema lint format \
        typecheck unit test e2e cluster-up cluster-down demo bench godriver clean kind-demo kind-down kind-test gpu-check

all: test

# The virtualenv is (re)built whenever either pyproject.toml changes: the product
# (dradriver, what `pip install .` and the image carry) and the checkout's developer
# tools (devtools/: local control plane, hollow nodes, demo), both editable.
$(STAMP): pyproject.toml devtools/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dradriver needs Python >= 3.11")'
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@echo "venv: installing dradriver and its development dependencies into $(VENV)"
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' -e ./devtools
	@touch $@

venv: $(STAMP)

# The image's modules are byte-compiled (pip compiles what it installs); the checkout's
# editable install is not, and with PYTHONDONTWRITEBYTECODE set every process (each plugin
# a test starts) would compile every module again: 0.3 s of a plugin's start here. Stale
# files are recompiled; __pycache__ is ignored by git.
bytecode: venv
	@$(PY) -m compileall -q -j 0 dradriver fakenvml devtools/dradriver_dev >/dev/null

# Cached under ~/.cache/dradriver keyed by the module's sources; a no-op when built.
controlplane:
	@bash tools/controlplane/build.sh >/dev/null

# The kubelet's own code as a node (`dradriver dev kubelet`), from the same Go modules.
hollow-node:
	@bash tools/controlplane/build.sh node >/dev/null

# The control plane and the hollow node of every line `make test` runs.
lines:
	@for line in $(LINES); do K8S=$$line bash tools/controlplane/build.sh >/dev/null && \
	  K8S=$$line bash tools/controlplane/build.sh node >/dev/null || exit 1; done

cdi-tool:
	@bash tools/cdi/build.sh >/dev/null

# dradriver-nvcdi (the driver's files a container needs, as NVIDIA's container toolkit
# computes them; the image carries it), nvidia-cdi-hook and nvidia-ctk, from tools/nvcdi.
nvcdi:
	@bash tools/nvcdi/build.sh >/dev/null

# The helm CLI the chart's tests and `make demo` render the chart with; cached the same way.
helm:
	@bash tools/helm/build.sh >/dev/null

# Kueue's manager and CRDs (tests/e2e/test_kueue.py: fair sharing of our GPUs), built from
# its Go module and cached the same way; nothing ships.
kueue:
	@bash tools/kueue/build.sh >/dev/null

# Debian's prometheus and chromium, unpacked into the cache (never installed): the fleet
# dashboard's queries are checked against a real Prometheus, its picture in a real browser.
prometheus chromium:
	@bash tools/debian/fetch.sh $@ >/dev/null

schema: venv
	$(PY) -c "import json; from dradriver.api.config import json_schema; print(json.dumps(json_schema(), indent=2, sort_keys=True))" > api/config/v1alpha1.schema.json

proto: venv
	$(PY) tools/genproto.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

# The unit tests once (they talk to no Kubernetes); the end-to-end tests on each line.
test: venv bytecode lines cdi-tool nvcdi helm kueue prometheus chromium lint typecheck
	@set -e; for line in $(WHOLE_SUITE_LINES); do \
	  what=$$([ $$line = $(firstword $(WHOLE_SUITE_LINES)) ] && echo "tests" || echo "tests/e2e"); \
	  echo "== Kubernetes $$line: $$what"; \
	  K8S=$$line $(PY) -m pytest $$what $(XDIST) $(PYTEST_ARGS); done; \
	for line in $(DRA_TEST_LINES); do \
	  echo "== Kubernetes $$line: tests/e2e -m lines"; \
	  K8S=$$line $(PY) -m pytest tests/e2e -m lines $(XDIST) $(PYTEST_ARGS); done

e2e: venv bytecode controlplane hollow-node cdi-tool nvcdi helm kueue prometheus chromium
	$(PY) -m pytest tests/e2e $(XDIST) $(PYTEST_ARGS)

cluster-up: venv controlplane
	@$(PY) -m dradriver.cli dev cluster up --state-dir $(STATE) $(if $(filter 1 true yes,$(ALPHA)),--alpha) $(if $(filter 1 true yes,$(REPLACE)),--replace) $(if $(filter 1 true yes,$(WEBHOOK)),--webhook)

cluster-down: venv
	@$(PY) -m dradriver.cli dev cluster down --state-dir $(STATE)

demo: venv bytecode controlplane hollow-node nvcdi helm kueue
	@$(PY) -m dradriver_dev.demo $(if $(filter 1 true yes,$(KEEP)),--keep)

# dradriver as a user installs it: the image, the chart, real containerd in a kind cluster
# (deploy/kind/). Needs Docker, or root to start Debian's (tools/kind/engine.sh); offline,
# the node image and the Python base are built from Debian's packages and Go modules.
# The cluster stays up for kubectl; `make kind-down` removes it.
kind-demo: venv controlplane helm
	@$(PY) -m dradriver_dev.kind.demo demo

kind-down: venv
	@$(PY) -m dradriver_dev.kind.demo down

# The kind end-to-end tests (tests/kind/; CI runs them after `make test`): the image, the
# chart's pods, claims in real containers, a helm upgrade and uninstall.
kind-test: venv controlplane helm
	DRADRIVER_KIND_TESTS=1 $(PY) -m pytest tests/kind $(PYTEST_ARGS)

# dradriver against a real GPU, read-only (tools/gpu-check/run.sh): discovery beside the
# fake of the same product, the driver spec beside nvidia-ctk's, nvidia-smi through it.
# Needs no virtualenv where build/gpu-check/ is bundled (the GPU host lent to a task).
gpu-check:
	@bash tools/gpu-check/run.sh

# The Go peer `make bench` measures dradriver beside (tools/godriver: a minimal driver on
# the kubeletplugin helper of k8s.io/dynamic-resource-allocation); cached the same way.
godriver:
	@bash tools/godriver/build.sh >/dev/null

bench: venv bytecode controlplane hollow-node nvcdi godriver
	$(PY) benchmarks/prepare.py
	$(PY) benchmarks/gpu_locks.py

# What the slices cost the control plane at 10 to 500 nodes (benchmarks/README.md); about
# a quarter of an hour. A short run: make bench-fleet FLEET_ARGS="--nodes 10,50 --modes none"
.PHONY: bench-fleet
bench-fleet: venv bytecode controlplane
	$(PY) benchmarks/fleet.py $(FLEET_ARGS)

# How fast a sick GPU is tainted, its pod told and evicted (benchmarks/README.md); ~2 min.
.PHONY: bench-health
bench-health: venv controlplane hollow-node
	$(PY) benchmarks/health.py $(HEALTH_ARGS)

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
