# The README's commands. Each creates .venv (if needed) and installs the project into it.
#   make demo   pretrain the default model on the bundled Shakespeare corpus and print a sample
#   make test   run the test suite on the newest releases pip resolves, then the model, generation, cache,
#               save/load and remote-code tests on the oldest versions pyproject admits (constraints/floor.txt, in
#               .venv-floor); the long end-to-end runs are marked `slow`: make test-slow
PYTHON ?= python3
VENV ?= .venv
FLOOR_VENV ?= .venv-floor
# pytest-xdist workers of `make test`: each test file on one worker (`--dist loadfile`), two files at a time; the
# suite's commands spend much of their time starting Python, which one core does alone
TEST_WORKERS ?= 2
WHEEL_VENV ?= .venv-wheel
# The CPU build of torch; on a GPU machine use e.g. `make demo TORCH=torch`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install install-dev demo test test-newest test-floor test-wheel test-slow lint

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# `make demo` installs the package alone; the test tools and the clients the tests run (pytest, ruff, peft,
# lm-eval, TRL, onnxruntime, llama-cpp-python) come with `make test`. llama-cpp-python compiles llama.cpp for this
# CPU: its multimodal library is left out (not used), the build uses both cores, and its AMX kernels are left out
# (on x86): they have segfaulted on Sapphire Rapids (ggml-org/llama.cpp#20824). A wheel that pip cached from an
# earlier build with them (its system info says `AMX_INT8 = 1`) is rebuilt.
NO_AMX := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_CPP_BUILD := CMAKE_ARGS="-DLLAVA_BUILD=OFF" CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)" CMAKE_BUILD_PARALLEL_LEVEL=2
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(LLAMA_CPP_BUILD) $(BIN)/python -m pip install --quiet "$(TORCH)" -e ".[dev]"
	$(BIN)/python -c "import llama_cpp, sys; sys.exit(b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info())" \
		|| $(LLAMA_CPP_BUILD) $(BIN)/python -m pip install --quiet --no-cache-dir --force-reinstall --no-deps llama-cpp-python
	touch $@

$(FLOOR_VENV)/.installed: pyproject.toml constraints/floor.txt
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c constraints/floor.txt "$(TORCH)" -e ".[peft,verse]" pytest \
		pytest-xdist
	touch $@

demo: install
	$(BIN)/minirope-pretrain

test: test-newest test-floor test-wheel

test-newest: install-dev
	$(BIN)/ruff check src tests benchmarks evals examples
	$(BIN)/ruff format --check src tests benchmarks evals examples
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

# The tests of what a saved folder's code meets under an older transformers: the model against Llama, generation
# and the cache, save/load and remote code, the task heads; and post-training with the oldest TRL.
FLOOR_TESTS := tests/test_generate.py tests/test_generation_conformance.py tests/test_meta_device.py \
	tests/test_oracle.py tests/test_model_conformance.py tests/test_save_load.py tests/test_heads.py \
	tests/test_rope.py tests/test_rope_forms.py tests/test_config.py tests/test_interop.py tests/test_compat.py \
	tests/test_rewards.py tests/test_posttrain.py tests/test_tasks.py

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -c "import transformers; print('floor versions: transformers', transformers.__version__)"
	$(FLOOR_VENV)/bin/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist worksteal $(FLOOR_TESTS)

# The package as users install it: `python -m build` makes the sdist and, from it, the wheel; `twine check` reads
# both; the wheel goes into a new venv (not editable) and tests/wheel_check.py runs its commands from an empty folder.
test-wheel: install-dev
	rm -rf dist $(WHEEL_VENV)
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip install --quiet "$(TORCH)" dist/*.whl
	cd $$(mktemp -d) && $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/tests/wheel_check.py

test-slow: install-dev
	$(BIN)/python -m pytest -m slow

lint: install-dev
	$(BIN)/ruff check src tests benchmarks evals examples
