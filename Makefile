# The README's commands: `make demo`, `make test`, `make test-quick`. All work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# System packages the integration tests need (real sshd nodes in network namespaces, a
# world-readable Python for the node user, OpenMPI for the mpi backend, OpenBLAS for the
# ranks to preload in place of the reference BLAS in MLX's Linux wheel, iperf3 for the
# bench's cross-check, headless Chromium for the dashboard and report pages, tmux for the
# terminal monitor in a real terminal, zsh for nodes that log in as a stock Mac does,
# bsdtar (libarchive-tools) for nodes whose tar is a Mac's, a C compiler for the library
# sandbox nodes preload (mlxops/sandbox/nospin.c)).
SYSTEM_PACKAGES := openssh-server openssh-client python3-venv iproute2 procps psmisc openmpi-bin \
	libopenblas0-pthread iperf3 chromium tmux zsh libarchive-tools prometheus nftables gcc

.PHONY: demo test test-unit test-quick lint venv venv-test system-deps clean

# Two stamps, so `make demo` installs the package alone (its dependencies: mlx, numpy,
# fabric, click...) and `make test` adds the test extras on top (ansible-core, datasets,
# pyarrow, mlx-lm, openai...), which were most of a fresh clone's `make demo` time
# (benchmarks/README.md, "make demo in a fresh clone").
venv: $(VENV)/.package
venv-test: $(VENV)/.test-extras

$(VENV)/.package: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-extras: $(VENV)/.package
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# Installs system packages when root and something is missing; otherwise says what to do.
system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing system packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "not root: integration tests will skip (missing: $$missing)"; \
	fi

# --fresh: a second `make demo` starts over instead of refusing the demo's checkpoints.
demo: venv
	$(VENV)/bin/mlxops launch --fresh jobs/demo.yml

# The whole suite is one pytest on TEST_WORKERS workers (pytest-xdist; --dist loadfile keeps
# a module on one worker, so its module fixtures are made once; each worker brings up its
# own session sandboxes; a few modules that must not overlap share one worker:
# SHARED_WORKER in tests/conftest.py, which makes --dist loadfile group them). Four on this
# project's 2-core machine: the sandbox scenarios wait more than they compute (watchdog
# polls, held jobs, sshd round trips: ~57% of two cores on three workers), and the unit
# tests, collected last, fill the others' waits instead of running alone first
# (docs/testing.md, "The suite's time"). --durations shows in the log where the time goes.
PYTEST_WORKERS ?= auto
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile
TEST_WORKERS ?= 4
# The tests run with bytecode written, whatever the environment says: this project's CI
# machine sets PYTHONDONTWRITEBYTECODE=1, and then each of the ~1,300 Pythons the suite
# starts from the clone (CLI runs, references, the sandbox's helpers) compiled the
# controller's modules from source again: importing the CLI's job stack took 0.36 s of CPU
# instead of 0.20 (docs/testing.md, "The suite's time"). Node helpers still write none
# (transport/nodecmd.py: `mlxops check` leaves a node's code as it was synced).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

test: venv-test system-deps
	$(PYTEST) -q -ra tests -n $(TEST_WORKERS) --dist loadfile --durations=30

test-unit: venv-test
	$(PYTEST) -q tests/unit -m "not tools" $(PARALLEL)

# A developer's quick subset: no sandbox, no slow scenario, no package index or linter.
test-quick: venv-test
	@$(PYTEST) -q tests/unit -m "not slow and not tools" $(PARALLEL); unit=$$?; \
	$(PYTEST) -q --ignore=tests/unit -m "not integration and not slow and not tools"; \
	rest=$$?; if [ $$unit != 0 ]; then exit $$unit; fi; exit $$rest

lint: venv-test
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info
