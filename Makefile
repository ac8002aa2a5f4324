# comfyfleet: `make serve` runs the server, `make test` runs the whole suite.
PYTHON ?= python3
# Browser tests use the system's chromium: Playwright must never download one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test lint docs bench conformance chaos run-example emulate run-fanout-example editor-1.27 clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The server with embedded defaults: SQLite and files under ./data. Extra flags: make serve ARGS="--port 8190"
serve: $(STAMP)
	$(BIN)/comfyfleet serve --data-dir data $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench chaos
	$(BIN)/ruff format --check src tests bench chaos
	$(BIN)/mypy

# pytest exits 5 when it collected nothing: no tests is a defect, not a pass.
# Bytecode first, as a wheel install has it: the suite starts hundreds of processes,
# and with PYTHONDONTWRITEBYTECODE set each would compile every module it loads.
test: lint editor-1.27
	$(BIN)/python -m compileall -q src > /dev/null
	$(BIN)/python -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The documentation site into site/: the reference pages are written from the code first
# (docs/gen/reference.py), then mkdocs fails on any warning (a broken link or anchor).
docs: $(STAMP)
	$(BIN)/python docs/gen/reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Every benchmark in bench/, one at a time; rewrites BENCHMARKS.md (notes: bench/notes.md).
bench: $(STAMP)
	$(BIN)/python -m compileall -q src > /dev/null
	$(BIN)/python bench/run_all.py

# ComfyUI's own execution suite through comfyfleet in every configuration; writes
# CONFORMANCE.md. Needs COMFYUI_DIR and COMFY_VENV (conformance/README.md); not in `test`.
conformance: $(STAMP)
	CF_BIN=$(abspath $(BIN))/comfyfleet $(BIN)/python conformance/report.py $(ARGS)

# Randomized fault schedules against three gateways on a private PostgreSQL cluster and
# their backends; writes CHAOS.md (chaos/README.md). Not in `test`: minutes per schedule.
# Replay one: make chaos ARGS="--seed 1234 --schedules 1"
chaos: $(STAMP)
	$(BIN)/python chaos/run.py $(ARGS)

run-example: $(STAMP)
	$(BIN)/comfyfleet run examples/invert.json --output-dir output

# The paid-API stand-in the fan-out examples call, on 127.0.0.1:8299 (BFL and OpenAI
# protocols, no key needed). Flags: make emulate ARGS="--latency 5s --throttle-rate 0.3"
emulate: $(STAMP)
	$(BIN)/comfyfleet emulate-provider $(ARGS)

# Thirty FLUX jobs through one collector, against `make emulate` running elsewhere.
# Another emulator: make run-fanout-example ARGS='--set "API Settings.base_url=http://host:port"'
run-fanout-example: $(STAMP)
	$(BIN)/comfyfleet run examples/flux-concurrent-30.json --output-dir output $(ARGS)

# The editor ComfyUI 0.3.64 pins (comfyui-frontend-package 1.27.10) unpacked into .cache/,
# for `comfyfleet serve --front-end-root $(PINNED_EDITOR)` and the tests that check it still
# works (the default, installed with comfyfleet, is the newer 1.58.1).
PINNED_EDITOR_VERSION := 1.27.10
PINNED_EDITOR := .cache/comfyui-frontend-$(PINNED_EDITOR_VERSION)/comfyui_frontend_package/static
editor-1.27: $(PINNED_EDITOR)/index.html

$(PINNED_EDITOR)/index.html: | $(BIN)/python
	rm -rf .cache/comfyui-frontend-$(PINNED_EDITOR_VERSION)
	$(BIN)/python -m pip download --quiet --no-deps -d .cache/wheels comfyui-frontend-package==$(PINNED_EDITOR_VERSION)
	$(BIN)/python -m zipfile -e .cache/wheels/comfyui_frontend_package-$(PINNED_EDITOR_VERSION)-py3-none-any.whl .cache/comfyui-frontend-$(PINNED_EDITOR_VERSION)

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
