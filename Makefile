# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench-speed docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,llm,ray]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/reflectrl demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m slow

bench-speed: $(STAMP)
	$(BIN)/python benchmarks/ppo_speed.py

docs: $(STAMP)
	$(BIN)/python scripts/gen_cli_docs.py > docs/cli.md

clean:
	rm -rf $(VENV) runs .pytest_cache
