# kvcoord developer targets. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.deps-stamp
# Python deps for tests (torch is large; installed once per virtualenv).
TEST_DEPS := maturin>=1.9.4,<2 tqdm pytest hypothesis pytest-benchmark numpy matplotlib cbor2 xxhash pyzmq msgspec torch

.PHONY: help
help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q $(foreach d,$(TEST_DEPS),"$(d)")
	touch $(STAMP)

.PHONY: venv
venv: $(STAMP) ## Create or reuse the virtualenv (.venv) with build and test deps

.PHONY: build-dev
build-dev: venv ## Build the Rust extension into the virtualenv (editable install)
	rm -f python/kvcoord/_core*.so
	$(PIP) install -q -e . --no-build-isolation --no-deps

.PHONY: run
run: build-dev ## Build everything and run the main job on its bundled default
	$(VENV)/bin/kvcoord

.PHONY: test-rust
test-rust: ## cargo test (pure Rust core; no Python needed)
	cargo test --workspace --locked

.PHONY: test-python
test-python: build-dev ## pytest (Python surface, conformance traces, hypothesis)
	$(VENV)/bin/pytest -q

.PHONY: test
test: test-rust test-python ## Run every test (cargo test + pytest)

.PHONY: test-vllm
test-vllm: build-dev ## vLLM 0.33.0's own tests on vLLM and on kvcoord (own venv .venv-vllm; needs the index)
	python3 tools/test_vllm.py --venv .venv-vllm --json .vllm-sdist/table.json

.PHONY: bench
bench: build-dev ## criterion benches + pytest-benchmark suite
	cargo bench -p kvcoord-core --locked
	$(VENV)/bin/pytest benches --benchmark-enable -q

.PHONY: lint
lint: build-dev ## cargo fmt/clippy, ruff, mypy, stubtest
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$(VENV)/bin/pip install -q ruff mypy types-tqdm
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest kvcoord._core --allowlist .stubtest-allowlist

.PHONY: clean
clean: ## Remove build outputs and the virtualenv
	cargo clean
	rm -rf $(VENV) python/kvcoord/_core*.so
