# The interface everyone uses. `.ci/run` calls `make test`; README says so.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
export PATH := $(CURDIR)/.venv/bin:$(PATH)
# Tests on the real control plane run as root (network namespaces, bridge).
PYTEST := $(PY) -m pytest
# The setup steps' progress lines count the time from the first make's start.
ifndef TORCHFLEX_BUILD_T0
export TORCHFLEX_BUILD_T0 := $(shell date +%s)
endif
BUILD := bash e2e/toolchain/build.sh

.PHONY: help venv toolchain demo-toolchain real-node-toolchain lint test test-unit test-integration test-e2e test-real-nodes cluster cluster-down demo bench clean

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20

venv: ## create/reuse the virtualenv (cached in ~/.cache/torchflex) and link .venv
	@bash scripts/venv.sh >/dev/null

toolchain: ## build every pinned binary the test tiers run (cached in ~/.cache/torchflex)
	@$(BUILD) >/dev/null

real-node-toolchain: ## also the real-node parts: kubelet, containerd/runc/CNI (apt), CoreDNS, registry, images' base
	@$(BUILD) --real-nodes >/dev/null

lint: venv ## ruff, mypy --strict, import-linter, chart/CRD drift checks
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	.venv/bin/lint-imports
	@cmp -s crds/elasticjob.yaml helm/torchflex/crds/elasticjob.yaml || { echo "helm/torchflex/crds/elasticjob.yaml drifted from crds/: cp crds/elasticjob.yaml helm/torchflex/crds/" >&2; exit 1; }

test-unit: venv toolchain ## pure-logic tests, no cluster, no network (helm for chart checks)
	$(PYTEST) tests/unit

test-integration: venv toolchain ## real processes, real API server, real etcd
	$(PYTEST) tests/integration

test-e2e: venv toolchain ## whole scenarios on the local control plane
	$(PYTEST) tests/e2e

test: venv toolchain real-node-toolchain ## every tier: lint, unit, integration, e2e, real nodes (two lanes: scripts/test-all.sh)
	@bash scripts/test-all.sh

test-real-nodes: venv toolchain real-node-toolchain ## the real-node tier alone (tests/realnode; part of `make test`)
	$(PYTEST) tests/realnode

cluster: venv ## start (or reuse) the local control plane; prints the env to use it
	@$(BUILD) control-plane tools >/dev/null
	@$(PY) -m e2e.cluster up

cluster-down: venv ## stop the local control plane and remove its state
	@$(PY) -m e2e.cluster down

# NODES=real: the same walkthrough on a real node (kubelet + containerd) with the project's images.
# The demo builds only what it runs: the control plane (and for NODES=real helm and
# the real node's parts), not the test tiers' kube-router, Kueue or cluster-autoscaler.
# Cold, the virtualenv (pip downloads torch: the network) and the Go builds (the
# CPUs) run side by side.
NODES ?= process
DEMO_PARTS := $(strip control-plane $(if $(filter real,$(NODES)),tools real-nodes))
demo: ## the main job: an elastic training demo on the local control plane (NODES=real: on a real node)
	@$(MAKE) --no-print-directory -j2 venv demo-toolchain
	@$(PY) -m e2e.demo --nodes $(NODES)

demo-toolchain:
	@$(BUILD) $(DEMO_PARTS) >/dev/null

bench: venv toolchain ## every benchmark; writes benchmarks/RESULTS.md
	@$(PY) -m benchmarks

clean: ## remove local state (not the caches)
	rm -rf .cluster .cluster-* .pytest_cache .mypy_cache .ruff_cache
