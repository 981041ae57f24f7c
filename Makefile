# dsec: `make demo` runs the main job, `make test` runs the tests; both set up first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup native tools demo test test-fast test-fuzz bench lint up clean

setup: $(VENV)/.installed $(VENV)/.kafka-jars native

# libdsec_inject.so and its header in ingest/native/build/, with the system compiler
# (make rebuilds it only when its sources changed).
native:
	@VENV=$(VENV) bash infra/setup.sh native

# Helm, Docker Compose and promtool for the deployment tests, built from their Go modules
# into ~/.cache/dsec/tools (minutes the first time, instant afterwards).
tools:
	@VENV=$(VENV) bash infra/setup.sh tools

# One line per step; pip's and Maven's own output goes to .venv/logs/.
$(VENV)/.installed: pyproject.toml
	@PYTHON=$(PYTHON) VENV=$(VENV) bash infra/setup.sh python
	@touch $@

$(VENV)/.kafka-jars: $(VENV)/.installed infra/kafka/pom.xml
	@VENV=$(VENV) bash infra/setup.sh kafka
	@touch $@

demo: setup
	$(BIN)/dsec demo --workers 4 --duration-s 60

up: setup
	$(BIN)/dsec up

# Every benchmark and the goodput experiment at a short setting (smoke, 2 workers, 40 s),
# one JSON object with all figures: probe on vs off, pipeline vs bare consumer, snapshot vs
# torch.save, vectorised vs cel-python policy evaluation, the reaction time from a metric
# sample to the command applied in the worker, goodput with and without dsec (~3 min).
bench: setup
	$(BIN)/dsec bench all --json

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mkdocs build --strict --quiet

# The unit tier alone: no broker, no services, a pytest worker per core (about a minute
# on 2 cores).
test-fast: lint
	$(BIN)/pytest tests/unit -n auto

# Every decoder of wire bytes against hostile inputs (hypothesis), no broker.
test-fuzz: lint
	$(BIN)/pytest tests/fuzz

# Every tier: unit, fuzz, integration (the real Kafka broker), deploy (Helm, Compose, image).
test: lint tools
	$(BIN)/pytest

clean:
	rm -rf $(VENV) .dsec .pytest_cache ingest/native/build
