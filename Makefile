# Two set-up commands for a fresh machine: `make demo` and `make test`. Each creates .venv when missing,
# installs what it needs (a stamp file makes the second run quick), then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export PYTHONUNBUFFERED := 1
# glibc malloc backs large blocks with transparent huge pages (XLA:CPU step buffers; mpa_jax/hostmem.py).
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: demo test install install-test install-bench bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.stamp-core: setup.py | $(BIN)/python
	$(BIN)/pip install -q -e ".[serve]"
	touch $@

$(VENV)/.stamp-test: setup.py $(VENV)/.stamp-core
	$(BIN)/pip install -q -e ".[test,serve]"
	touch $@

# External benchmarks run as env kinds (docs/benchmark.md). bfcl-eval is installed without its declared
# dependencies (they pin numpy==1.26.4 and pull vendor SDKs); its backends and checker need only filelock and
# mpmath. agentdojo comes with its dependencies: its task-suite module imports its agent pipeline package,
# which imports the vendor SDKs (pure-Python clients; never called here).
$(VENV)/.stamp-bench: Makefile $(VENV)/.stamp-core
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23
	$(BIN)/pip install -q filelock mpmath agentdojo==0.1.35
	touch $@

install: $(VENV)/.stamp-core
install-test: $(VENV)/.stamp-test $(VENV)/.stamp-bench
install-bench: $(VENV)/.stamp-bench

demo: install
	$(BIN)/mpa loop --config configs/tiny.py --workdir runs/demo

test: install-test
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	command -v adb >/dev/null || (apt-get update && apt-get install -y adb)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 tests

bench: install-test
	$(BIN)/python bench/run_all.py

clean:
	rm -rf runs .pytest_cache
