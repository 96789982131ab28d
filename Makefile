# raydp_llm — run `make help` for the targets.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'
	@echo "  pass Hydra overrides with ARGS='model.n_layer=6 train.max_steps=500'"

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade -q pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the project with its pinned dependencies

train: $(STAMP) ## the main job on an embedded Ray + Spark with the sample corpus
	$(BIN)/python -m raydp_llm.train $(ARGS)

smoke: $(STAMP) ## a tiny end-to-end run (about a minute on 2 cores)
	$(BIN)/python -m raydp_llm.train +experiment=smoke $(ARGS)

sweep: $(STAMP) ## 4 smoke jobs as Ray Tune trials, 2 at once, ASHA: sweep_summary.csv, sweep.png
	$(BIN)/python -m raydp_llm.train -m hydra/launcher=ray +experiment=smoke \
		optim.lr=3e-3,1e-2,5e-3,1e-5 cluster.num_cpus=4 sweep.scheduler=asha $(ARGS)

config: $(STAMP) ## print the composed config, each setting with its meaning (ARGS: overrides)
	$(BIN)/python -m raydp_llm.train --cfg job $(ARGS)

prepare: $(STAMP) ## the Spark ETL alone: Parquet windows + manifest.json
	$(BIN)/python -m raydp_llm.prepare $(ARGS)

test: $(STAMP) ## the test suite (unit + integration on the real engines)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP) ## the unit tests not marked slow (no engines, no worker groups): the edit-test loop
	$(BIN)/python -m pytest tests/unit -m "not slow" $(ARGS)

lint: $(STAMP) ## ruff: style and import checks
	$(BIN)/ruff check raydp_llm tests benchmarks

clean: ## remove outputs and caches (keeps .venv)
	rm -rf outputs multirun .pytest_cache

.PHONY: help install train smoke sweep config prepare test test-fast lint clean
