# The README's commands. Each creates .venv (if needed) and installs the project into it.
#   make demo   pretrain the default model on the bundled Shakespeare corpus and print a sample
#   make test   run the test suite (the long end-to-end runs are marked `slow`: make test-slow)
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch; on a GPU machine use e.g. `make demo TORCH=torch`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install install-dev demo test test-slow lint

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# `make demo` installs the package alone; the test tools and the clients the tests run (pytest, ruff, peft,
# lm-eval, TRL, onnxruntime, llama-cpp-python) come with `make test`. llama-cpp-python compiles llama.cpp:
# its multimodal library is left out (not used), and the build uses both cores.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/python -m pip install --quiet "$(TORCH)" -e ".[dev]"
	touch $@

demo: install
	$(BIN)/minirope-pretrain

test: install-dev
	$(BIN)/python -m pytest

test-slow: install-dev
	$(BIN)/python -m pytest -m slow

lint: install-dev
	$(BIN)/ruff check src tests benchmarks evals
