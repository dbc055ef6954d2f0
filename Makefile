# kvcoord developer targets. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Dependency sets, named as in pyproject.toml (tools/deps.py reads them there):
# `make run` needs only the build and the replay's own (no torch); the tests add
# pytest & co., torch (kvcoord.block_table; only PyPI's build is reachable here,
# the CUDA one) and Ray (the sweep's Ray executor, tests/test_executor.py).
RUN_SETS := build base plot
TEST_SETS := test torch ray
RUN_STAMP := $(VENV)/.deps-run
TEST_STAMP := $(VENV)/.deps-test
say = @echo "== $(1)"

.PHONY: help
help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(PY):
	$(call say,creating the virtualenv $(VENV))
	@python3 -m venv $(VENV)
	@$(PIP) install -q --upgrade pip

# install_sets(stamp, sets, what for)
define install_sets
	@echo "== installing $$($(PY) tools/deps.py --summary $(2)) $(3), and their dependencies"
	@$(PY) tools/deps.py $(2) | xargs -d '\n' $(PIP) install -q
	@touch $(1)
endef

$(RUN_STAMP): $(PY) pyproject.toml tools/deps.py
	$(call install_sets,$@,$(RUN_SETS),to build and replay)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml tools/deps.py
	$(call install_sets,$@,$(TEST_SETS),for the tests)

.PHONY: venv
venv: $(RUN_STAMP) ## Create or reuse the virtualenv (.venv) with what the build and `kvcoord` need

.PHONY: venv-test
venv-test: $(TEST_STAMP) ## The virtualenv with the test deps too (pytest, torch, Ray, ...)

.PHONY: build-dev
build-dev: venv ## Build the Rust extension into the virtualenv (editable install)
	$(call say,building the Rust extension (release; a few minutes the first time))
	@rm -f python/kvcoord/_core*.so
	@$(PIP) install -q -e . --no-build-isolation --no-deps

.PHONY: run
run: build-dev ## Build everything and run the main job on its bundled default
	$(call say,running kvcoord: the bundled chat workload on Llama-3.1-8B on one H100; then the pool it needs)
	@$(VENV)/bin/kvcoord

.PHONY: test-rust
test-rust: ## cargo test (pure Rust core; no Python needed)
	cargo test --workspace --locked

.PHONY: test-python
test-python: build-dev venv-test ## pytest (Python surface, conformance traces, hypothesis)
	$(VENV)/bin/pytest -q

.PHONY: test
test: test-rust test-python ## Run every test (cargo test + pytest)

.PHONY: test-vllm
test-vllm: build-dev engine-env ## vLLM's own tests (0.32.0, 0.33.0) on vLLM and on kvcoord, in the engine venvs (needs the index)
	@for v in $(ENGINE_VLLM); do \
		python3 tools/test_vllm.py --vllm $$v.0 --venv .venv-engine-$$v \
			--json .vllm-sdist/table-$$v.json || exit 1; \
	done

# vLLM series the engine tests run on, and where kvcoord's wheel for them goes.
ENGINE_VLLM ?= 0.32 0.33
ENGINE_WHEEL_DIR := target/engine-wheel
comma := ,
empty :=
space := $(empty) $(empty)

# kvcoord beside vLLM's own manager, run in each engine venv with the engines.
ENGINE_VLLM_TESTS := tests/kvcoord_vllm/test_api_drift.py tests/kvcoord_vllm/test_strict_mode.py \
	tests/kvcoord_vllm/test_lockstep_fuzz.py tests/test_events_wire.py

.PHONY: engine-env
engine-env: venv ## CPU engine virtualenvs (.venv-engine-<series>: vLLM with CPU kernels + kvcoord's wheel)
	rm -rf $(ENGINE_WHEEL_DIR)
	$(VENV)/bin/maturin build --release -q -o $(ENGINE_WHEEL_DIR)
	$(PY) tools/engine_env.py --versions $(subst $(space),$(comma),$(strip $(ENGINE_VLLM))) \
		--wheel "$$(ls $(ENGINE_WHEEL_DIR)/kvcoord-*.whl)"

.PHONY: test-engine
test-engine: engine-env ## Real vLLM engines on kvcoord against vLLM's own manager (tests/engine), each series in ENGINE_VLLM
	@for v in $(ENGINE_VLLM); do \
		echo "== engine tests on vLLM $$v"; \
		KVCOORD_ENGINE_VLLM=$$v VLLM_TARGET_DEVICE=cpu .venv-engine-$$v/bin/python -m pytest -q \
			tests/engine $(ENGINE_VLLM_TESTS) \
			-p no:cacheprovider -o addopts="-ra" || exit 1; \
	done

.PHONY: soak
soak: engine-env ## vllm serve on kvcoord under load and faults for KVCOORD_SOAK_SECONDS (600 by default), each series in ENGINE_VLLM
	@for v in $(ENGINE_VLLM); do \
		echo "== serving soak on vLLM $$v"; \
		KVCOORD_SOAK_SECONDS=$${KVCOORD_SOAK_SECONDS:-600} KVCOORD_ENGINE_VLLM=$$v VLLM_TARGET_DEVICE=cpu \
			.venv-engine-$$v/bin/python -m pytest -q tests/engine/test_soak.py \
			-p no:cacheprovider -o addopts="-ra" || exit 1; \
	done

.PHONY: fuzz
fuzz: engine-env ## The lockstep scheduler fuzz, longer (KVCOORD_FUZZ_SEEDS=400 by default), each series in ENGINE_VLLM
	@for v in $(ENGINE_VLLM); do \
		KVCOORD_FUZZ_SEEDS=$${KVCOORD_FUZZ_SEEDS:-400} VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \
			.venv-engine-$$v/bin/python -m pytest -q tests/kvcoord_vllm/test_lockstep_fuzz.py \
			-p no:cacheprovider -o addopts="-ra" || exit 1; \
	done

.PHONY: bench
bench: build-dev venv-test ## criterion benches + pytest-benchmark suite
	cargo bench -p kvcoord-core --locked
	$(VENV)/bin/pytest benches --benchmark-enable -q

.PHONY: validate
validate: build-dev ## The step-time and KV pool models against published vLLM measurements (docs/validation.md)
	$(call say,replaying every published run the models cover (about two minutes))
	@$(PY) -m kvcoord.replay.validate

.PHONY: lint
lint: build-dev venv-test ## cargo fmt/clippy, ruff, mypy, stubtest
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$(PY) tools/deps.py lint | xargs -d '\n' $(PIP) install -q
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(PY) tools/check_module_cycles.py
	$(PY) tools/check_import_cycles.py
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest kvcoord._core --allowlist .stubtest-allowlist

.PHONY: clean
clean: ## Remove build outputs and the virtualenv
	cargo clean
	rm -rf $(VENV) python/kvcoord/_core*.so
