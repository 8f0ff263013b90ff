# refold: the two commands are `make run` and `make test`. Everything else is for longer sessions.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest
# The JVM parts (Apache Kafka's broker, Spark's Kafka connector, HDFS for a test, Apicurio Registry), fetched with mvn from deploy/jars/pom.xml by coordinates.
JARS := .jars
JARS_STAMP := $(JARS)/.fetched
# The driver JVM's class archive (processors/runtime/class_archive.py): Spark starts on about
# half the CPU. Built after the jars, since fetching them empties $(JARS).
ARCHIVE_STAMP := $(JARS)/jvm/.built
DEPS := $(STAMP) $(JARS_STAMP) $(ARCHIVE_STAMP)
# The Python peers of `make bench-peers` (the `peers` extra: Quix Streams, Bytewax, matplotlib),
# in a venv of their own: Quix Streams pins an older confluent-kafka than refold runs on.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup run test test-unit test-integration test-spark test-docker lint docs fmt contracts-check bench bench-peers soak up down status clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is required"; exit 1; }
	@command -v java >/dev/null || { echo "Java 17 is required by PySpark (apt-get install -y openjdk-17-jre-headless)"; exit 1; }
	@command -v redis-server >/dev/null || { \
		echo "installing redis-server with apt-get"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v chromium >/dev/null || { \
		echo "installing chromium and chromium-driver with apt-get (the dashboard's browser test)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[local,dev]'
	@touch $(STAMP)

# Spark's Kafka connector must be the installed PySpark's version: pyproject.toml pins it, and
# it is handed to mvn from there (the one place), so the venv comes first. Likewise the HDFS
# minicluster and the Hadoop client PySpark ships.
PYSPARK_HADOOP_VERSION := import pathlib, pyspark; jars = pathlib.Path(pyspark.__file__).parent / 'jars'; \
	print(next(jars.glob('hadoop-client-api-*.jar')).stem.removeprefix('hadoop-client-api-'))
$(JARS_STAMP): $(STAMP) deploy/jars/pom.xml $(wildcard deploy/jars/*/pom.xml)
	@command -v mvn >/dev/null || { echo "Maven is required to fetch Apache Kafka's jars (apt-get install -y maven)"; exit 1; }
	@echo "fetching Apache Kafka's (and its LocalTieredStorage plugin), Spark's Kafka connector's, HDFS minicluster's, Apicurio Registry's, Kafka Connect's (a test's client) and the benchmark peers' (Kafka Streams, Flink) jars with mvn (deploy/jars/pom.xml) into $(JARS)/"
	rm -rf $(JARS)
	mvn -B -q -Dstyle.color=never -f deploy/jars/pom.xml dependency:copy-dependencies -Djars.dir="$(CURDIR)/$(JARS)" \
		-Dspark.version=$$($(BIN)/python -c 'import pyspark; print(pyspark.__version__)') \
		-Dhadoop.version=$$($(BIN)/python -c "$(PYSPARK_HADOOP_VERSION)")
	@touch $(JARS_STAMP)

# An optimisation: if it cannot be built, say so and go on (sessions start without it).
$(ARCHIVE_STAMP): $(JARS_STAMP)
	@if $(BIN)/python -m refold.processors.runtime.class_archive > $(JARS)/class-archive.log 2>&1; \
	then tail -1 $(JARS)/class-archive.log; touch $(ARCHIVE_STAMP); \
	else echo "the JVM class archive was not built (see $(JARS)/class-archive.log): Spark starts without it, slower"; fi

$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q --upgrade pip
	$(PEERS_VENV)/bin/pip install -q -e '.[peers]'
	@touch $(PEERS_STAMP)

setup: $(DEPS) $(PEERS_STAMP) ## create .venv (and .venv-peers), install refold with Spark and dev tools, redis-server, chromium, the Kafka broker's, Spark connector's and peers' jars (mvn), and the driver JVM's class archive

run: $(DEPS) ## the demo: local stack, thirteen processors in one Spark app, ~130k events, summary, replay + cutover, insights to a webhook, the archive read by DuckDB, refold serve with its dashboard
	$(BIN)/refold demo

# Test files run in parallel workers (pytest-xdist, a file per worker at a time) that share the
# run's one broker and Redis: the suite mostly waits on processes and servers, not the 2 cores.
TEST_WORKERS ?= 3
test: $(DEPS) ## unit + integration + spark tests (what CI runs; TEST_WORKERS=3 files at a time)
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile tests/unit tests/integration tests/spark

test-unit: $(DEPS) ## fast loop: pure logic only (and the pinned jars make setup fetched)
	$(PYTEST) tests/unit

test-integration: $(DEPS) ## real Apache Kafka broker + real redis-server
	$(PYTEST) tests/integration

test-spark: $(DEPS) ## real local SparkSession and streaming queries
	$(PYTEST) tests/spark

lint: $(STAMP) ## ruff + mypy + the docs site in strict mode
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy refold bench
	$(MAKE) --no-print-directory docs

# MkDocs 1.6 is pinned (<2); its notice about a version 2 is not for this build. Not --quiet:
# with it, MkDocs 1.6 counts no warnings and strict mode passes a broken link.
docs: $(STAMP) ## build the docs site into build/site (strict: a broken link or reference fails)
	DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

fmt: $(STAMP) ## format and autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

contracts-check: $(STAMP) ## schema locks (refold contracts check), round trips, BACKWARD_TRANSITIVE gate
	$(BIN)/refold contracts check
	$(PYTEST) tests/unit/contracts

bench: $(DEPS) ## throughput and latency benchmark on a private local stack
	$(BIN)/python -m bench

bench-peers: $(DEPS) $(PEERS_STAMP) ## refold beside Quix Streams, Bytewax, Kafka Streams and Flink, each as its docs show it, at three backlog sizes (SIZES=200000,1000000,5000000; ~45 min)
	$(BIN)/python -m bench peers --sizes $(or $(SIZES),200000,1000000,5000000)

soak: $(DEPS) ## fault suite, big: 1M events and 50 kill -9s, Redis and broker faults; prints the table
	$(BIN)/python -m tests.support.soak

up: $(DEPS) ## start the local stack on fixed ports (REFOLD_KAFKA_PORT, REFOLD_REDIS_PORT)
	$(BIN)/refold up

down: $(DEPS) ## stop the local stack
	$(BIN)/refold down

status: $(DEPS) ## show the local stack
	$(BIN)/refold status

clean: ## remove the virtualenv and local state
	rm -rf $(VENV) $(PEERS_VENV) $(JARS) .state .pytest_cache .mypy_cache .ruff_cache *.egg-info
test-docker: $(STAMP) ## the integration scenario against deploy/compose.yaml (needs a Docker engine)
	$(PYTEST) tests/docker
