# Two commands get a fresh machine from nothing to a result:
#   make demo   set up, then run the quickstart job
#   make test   set up, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fedtune-installed

.PHONY: setup servers demo test test-fast bench mlflow-ui clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU wheel is local and fast; a bare range would pull CUDA builds.
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

# FEDTUNE_REQUIRE_SERVERS=1: a server `make servers` should have provided fails, never skips.
test: setup servers
	FEDTUNE_REQUIRE_SERVERS=1 $(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/fedtune bench engine examples/quickstart.yaml

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///.fedtune/mlflow.db --port 5000

clean:
	rm -rf .fedtune
