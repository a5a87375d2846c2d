# Two commands get a fresh machine from nothing to a result:
#   make demo   set up, then run the quickstart job
#   make test   set up, lint (ruff, mypy, import contracts, module sizes), then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fedtune-installed
# One pytest worker per core of the 2-core machines (pytest-xdist); a test file stays on one
# worker, so its module fixtures are built once. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: setup servers demo lint test test-fast bench mlflow-ui clean cluster-binaries cluster-up cluster-down

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned, so the project's range cannot pull a newer release. On the polyglot
	# machines this is PyPI's default CUDA 13 build (about 3.5 GB with its nvidia-* wheels; it runs
	# on the CPU too): measured 6.5 min for the whole set-up and a 6.5 GB venv (docs/cluster-testing.md).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The real servers the `cluster` tests meet: PostgreSQL (apt-get) and MinIO built from source,
# cached in ~/.cache/fedtune; fast once done.
servers:
	scripts/servers/setup.sh

demo: setup
	$(BIN)/fedtune validate examples/quickstart.yaml
	$(BIN)/fedtune run examples/quickstart.yaml --fresh --summary-json .fedtune/quickstart-summary.json

# The cluster tests' control plane (docs/cluster-testing.md): built once from the Kubernetes
# sources into ~/.cache/fedtune/k8s, never into the repository.
K8S := scripts/k8s/controlplane.py

cluster-binaries:
	$(PYTHON) $(K8S) build

cluster-up: setup cluster-binaries
	$(BIN)/python $(K8S) up

cluster-down:
	$(PYTHON) $(K8S) down

# PYTHONPATH=src: lint-imports analyses this checkout's source even where the venv's editable
# install points at another one.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	PYTHONPATH=src $(BIN)/lint-imports
	$(BIN)/python scripts/check_module_size.py

# FEDTUNE_REQUIRE_SERVERS=1: a server `make servers` should have provided fails, never skips.
test: setup lint servers
	@if command -v go >/dev/null; then $(PYTHON) $(K8S) build; \
	else echo "no go on PATH: the cluster tests will be skipped"; fi
	FEDTUNE_REQUIRE_SERVERS=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

bench: setup
	$(BIN)/fedtune bench engine examples/quickstart.yaml

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///.fedtune/mlflow.db --port 5000

clean:
	rm -rf .fedtune
