# Two commands on a fresh machine: `make run` serves, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CACHE := .cache/claude-code-$(CLAUDE_CODE_VERSION)
CLAUDE_BIN := $(CLAUDE_CACHE)/node_modules/@anthropic-ai/claude-code/bin/claude.exe
AGENT_IMAGE ?= agent-server:dev

.PHONY: run test lint unit bench clean image

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What serving needs: the package and its runtime dependencies only.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# What testing needs on top: the dev extra (pytest, ruff, mypy, ...).
$(DEV_STAMP): pyproject.toml $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The real Claude Code CLI, pinned, from npm (no network beyond npm at install).
$(CLAUDE_BIN):
	mkdir -p $(CLAUDE_CACHE)
	npm install --prefix $(CLAUDE_CACHE) --no-audit --no-fund --loglevel=error \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	test -x $(CLAUDE_BIN)

# Serve on 127.0.0.1:8000. A Claude Code agent with no runtime command of its own (none
# configured, no `claude` on PATH) gets the pinned CLI, installed here once.
run: $(RUN_STAMP)
	@case "$${AGENT_RUNTIME:-claude-code}" in claude|claude-code) claude_runtime=1;; *) claude_runtime=;; esac; \
	if [ -n "$$claude_runtime" ] && [ -z "$$AGENT_SERVER_RUNTIME_COMMAND" ] && ! command -v claude >/dev/null; then \
		$(MAKE) --no-print-directory $(CLAUDE_BIN) && \
		AGENT_SERVER_RUNTIME_COMMAND="$(abspath $(CLAUDE_BIN))" exec $(BIN)/agent-server serve; \
	else \
		exec $(BIN)/agent-server serve; \
	fi

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: $(DEV_STAMP)
	$(BIN)/pytest tests/unit

# The agent image; local Debian bases when no registry has the official ones (docker/).
image:
	AGENT_IMAGE=$(AGENT_IMAGE) bash docker/build-image.sh

# The image tier (tests/image) runs when a docker daemon answers: build the image first.
test: $(DEV_STAMP) $(CLAUDE_BIN) lint
	if timeout 30 docker info > /dev/null 2>&1; then $(MAKE) --no-print-directory image; fi
	AGENT_SERVER_TEST_CLAUDE_BIN=$(abspath $(CLAUDE_BIN)) AGENT_SERVER_TEST_IMAGE=$(AGENT_IMAGE) \
		$(BIN)/pytest --cov --cov-report=term:skip-covered

bench: $(DEV_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .coverage .hypothesis
