# p4bs — `make setup` installs everything (idempotent; a second run takes seconds),
# `make test` runs the linters, the type checker and the whole test suite.
# Downloads and builds go to .cache/ (git-ignored); the venv to .venv/.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CACHE   := .cache
VENV    := .venv
PY      := $(VENV)/bin/python
UV_VERSION := 0.13.9
UV      := $(CACHE)/uv/bin/uv
UV_CACHE := $(CURDIR)/$(CACHE)/uv-cache
UV_PIP  := UV_CACHE_DIR=$(UV_CACHE) $(UV) pip
INSTALL_UV := [ -x $(UV) ] || $(PY) -m pip install -q --target $(CACHE)/uv "uv==$(UV_VERSION)"
STAMPS  := $(CACHE)/stamps
GO_ENV  := GOPATH=$(CURDIR)/$(CACHE)/go GOBIN=$(CURDIR)/$(CACHE)/bin GOFLAGS=-modcacherw
MVN     := mvn -q -B -f infra/jars/pom.xml -Dmaven.repo.local=$(CURDIR)/$(CACHE)/m2
# MAKEFLAGS and MFLAGS emptied: under make -j they name the jobserver's descriptors, which
# make does not pass to a plain recipe line, and cargo warned of them on every call.
CARGO   := MAKEFLAGS= MFLAGS= CARGO_HOME=$(CURDIR)/$(CACHE)/cargo cargo
# The Cargo workspace (Cargo.toml) less its fuzz targets, which p4/model/fuzz/run.sh builds.
WORKSPACE := --workspace --exclude p4bs-model-fuzz

APT_PACKAGES := iproute2 tshark tcpdump ethtool procps curl iputils-ping \
                openjdk-17-jdk-headless maven python3-venv build-essential zlib1g-dev \
                libssl-dev pkg-config chromium chromium-driver
INFLUXDB_VERSION := v1.8.10
GNMI_VERSION     := v0.14.1
PYTHON_SOURCES   := core schemas linux-tc infra streaming-jobs sinks exporter optimizer loop ops eval cli tests

.PHONY: help setup apt python jars tools dashboard-assets build functions rust test test-rust \
        test-unit test-system test-testbed lint lint-rust lint-python format clean-stack locks
help:
	@echo "make setup         install system packages, the venv, the JVM jars and the Go tools"
	@echo "make test          lint, type-check and run every test (starts Kafka/InfluxDB itself)"
	@echo "make test-unit     the fast loop: tests/unit (no root, no services; under 3 minutes)"
	@echo "make test-system   tests/system: against real Kafka, InfluxDB and Flink"
	@echo "make test-testbed  tests/testbed: root, network namespaces, real TCP through the router"
	@echo "make format        apply ruff's formatting and fixes"
	@echo "make locks         requirements/*.lock again from pyproject.toml (after changing a dependency)"

# The system packages first (the compilers and headers the rest build with), then the rest two
# at a time, the Rust workspace's compile (the longest, 3.5 min here) from the start, beside
# the venv's install and then the downloads and the fuzz build. The Java functions once the
# venv is in: they compile against its Flink.
setup: apt
	$(MAKE) --no-print-directory -j2 -O python rust jars tools dashboard-assets fuzz-build functions
	@echo "setup done: $$(du -sh $(VENV) | cut -f1) venv, $$(du -sh $(CACHE) | cut -f1) cache"

# System packages; installed only when one is missing.
apt:
	@missing=$$(for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $$missing >/dev/null; \
	fi
	@command -v go >/dev/null || { echo "go is required (the machine image ships it)"; exit 1; }
	@command -v npm >/dev/null || { echo "npm is required (the machine image ships it)"; exit 1; }

python: $(STAMPS)/python
# Every extra and the development tools, from the development lock (hashes checked); the
# project itself, editable, in a second call (a local path has no hash to check). uv installs
# them: it downloads and unpacks in parallel, 7 GB in 77 s here, where pip took 207 s (both
# from empty caches). uv itself goes to .cache/uv, installed by the venv's pip, which stays as
# Python ships it. The bytecode is compiled at install: the shell here sets
# PYTHONDONTWRITEBYTECODE=1, so a module left uncompiled is compiled again by every process
# that imports it.
$(STAMPS)/python: requirements/dev.lock pyproject.toml
	@mkdir -p $(STAMPS)
	[ -x $(PY) ] || python3.11 -m venv $(VENV)
	$(INSTALL_UV)
	$(UV_PIP) install -q --python $(PY) --require-hashes --compile-bytecode -r requirements/dev.lock
	$(UV_PIP) install -q --python $(PY) --no-deps -e .
	touch $@

jars: $(STAMPS)/jars
$(STAMPS)/jars: infra/jars/pom.xml
	@mkdir -p $(STAMPS)
	rm -rf $(CACHE)/jars
	for profile in kafka flink; do \
	  $(MVN) -P$$profile dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(CURDIR)/$(CACHE)/jars/$$profile; \
	done
	touch $@

# The charting library `p4bs dashboard` serves (ops/dashboard-assets: pinned by its lock file),
# installed into .cache/dashboard/node_modules; the dashboard never fetches it at run time.
DASHBOARD_ASSETS := $(CACHE)/dashboard
dashboard-assets: $(STAMPS)/dashboard-assets
$(STAMPS)/dashboard-assets: ops/dashboard-assets/package.json ops/dashboard-assets/package-lock.json
	@mkdir -p $(STAMPS) $(DASHBOARD_ASSETS)
	cp ops/dashboard-assets/package.json ops/dashboard-assets/package-lock.json $(DASHBOARD_ASSETS)/
	cd $(DASHBOARD_ASSETS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

tools: $(CACHE)/bin/influxd $(CACHE)/bin/gnmi_cli
$(CACHE)/bin/influxd:
	$(GO_ENV) go install github.com/influxdata/influxdb/cmd/influxd@$(INFLUXDB_VERSION)
$(CACHE)/bin/gnmi_cli:
	$(GO_ENV) go install github.com/openconfig/gnmi/cmd/gnmi_cli@$(GNMI_VERSION)

# The compiled parts: Rust, built into .cache/target/release/, and the Java functions the
# metrics job's SQL calls, compiled against the Flink that PyFlink ships.
FUNCTIONS_JAR := $(CACHE)/build/flink-functions/p4bs-flink-functions.jar
JAVA_SOURCES  := $(shell find streaming-jobs/functions -name '*.java')
build: functions rust
functions: $(FUNCTIONS_JAR)
$(FUNCTIONS_JAR): $(JAVA_SOURCES) $(STAMPS)/python
	rm -rf $(@D) && mkdir -p $(@D)/classes
	javac -Xlint:all,-processing -Werror --release 17 -d $(@D)/classes \
	  -cp "$$($(PY) -c 'import os, pyflink; print(os.path.dirname(pyflink.__file__))')/lib/*" \
	  $(JAVA_SOURCES)
	jar cf $@ -C $(@D)/classes .

rust:
	$(CARGO) build -q --release --locked $(WORKSPACE) --target-dir $(CURDIR)/$(CACHE)/target

# rustfmt and clippy; ruff and mypy. `make test` runs the two side by side.
lint: lint-rust lint-python
lint-rust:
	$(CARGO) fmt --all --check
	$(CARGO) clippy -q --release --locked $(WORKSPACE) --target-dir $(CURDIR)/$(CACHE)/target \
	  --all-targets -- -D warnings
lint-python:
	$(VENV)/bin/ruff check $(PYTHON_SOURCES)
	$(VENV)/bin/ruff format --check $(PYTHON_SOURCES)
	$(VENV)/bin/mypy

format:
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format $(PYTHON_SOURCES)
	$(VENV)/bin/ruff check --fix $(PYTHON_SOURCES)

# Python's linters beside the Rust chain: mypy runs on one core for 48 s, cargo's compile of
# the test binaries and the fuzz crate's clippy take 90 s, mostly on one core too. Then the
# unit tests on both cores (CPU-bound, sharing nothing; beside the two chains, make -j3, the
# three took 291 s here, against 150 s and then 126 s), and the system and testbed tests one
# at a time: they time real traffic and services, and keep both cores busy (77% on average
# here). Beside each other, the load failed a Flink TaskManager's start and a Kafka
# transaction's end within their timeouts.
test: build
	$(MAKE) --no-print-directory -j2 -O lint-python test-rust
	$(VENV)/bin/pytest -ra --durations=10 -n 2 tests/unit
	$(VENV)/bin/pytest -ra --durations=30 tests/system tests/testbed

# The Rust tests, after rustfmt and clippy, then each fuzz target for 20 s (a smoke test on a
# fresh corpus; `make fuzz` runs them longer).
test-rust: lint-rust
	$(CARGO) test -q --release --locked $(WORKSPACE) --target-dir $(CURDIR)/$(CACHE)/target
	FUZZ_SECONDS=20 p4/model/fuzz/run.sh

# The three folders of tests/ (tests/README.md), each on its own; `make test` runs them all.
test-unit: build
	$(VENV)/bin/pytest -ra -n 2 tests/unit
test-system test-testbed: test-%: build
	$(VENV)/bin/pytest -ra tests/$*

# cargo-fuzz for the packet parser's fuzz targets (p4/model/fuzz/, run on the nightly toolchain).
.PHONY: fuzz-tools fuzz-build fuzz
fuzz-tools: $(CACHE)/cargo/bin/cargo-fuzz
# A debug build: it only runs cargo, and compiles in 38 s here against 57 s for a release one.
$(CACHE)/cargo/bin/cargo-fuzz:
	$(CARGO) install -q --debug cargo-fuzz --locked --version 0.13.2

fuzz-build: fuzz-tools
	p4/model/fuzz/run.sh --build-only

# Each fuzz target for FUZZ_SECONDS (default 60); a crash fails it and names its input file.
fuzz: fuzz-tools
	p4/model/fuzz/run.sh

# The locks in requirements/ from pyproject.toml, at the versions dev.lock holds (uv);
# `make setup` then installs what changed.
locks: $(STAMPS)/python
	$(INSTALL_UV)
	UV=$(UV) UV_CACHE_DIR=$(UV_CACHE) UPGRADE="$(UPGRADE)" requirements/compile.sh

# Stops a stack left by `p4bs stack up` in the default state folder.
clean-stack:
	-$(VENV)/bin/p4bs stack down
