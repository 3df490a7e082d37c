# Two commands on a fresh machine: `make run` serves, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# The real CLIs, pinned; `make conformance CODEX_VERSION=…` judges any other release.
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CACHE := .cache/claude-code-$(CLAUDE_CODE_VERSION)
CLAUDE_BIN := $(CLAUDE_CACHE)/node_modules/@anthropic-ai/claude-code/bin/claude.exe
CODEX_VERSION := 0.171.0
CODEX_CACHE := .cache/codex-$(CODEX_VERSION)
CODEX_BIN := $(CODEX_CACHE)/node_modules/@openai/codex/bin/codex.js
GEMINI_CLI_VERSION := 0.61.0
GEMINI_CACHE := .cache/gemini-cli-$(GEMINI_CLI_VERSION)
GEMINI_BIN := $(GEMINI_CACHE)/node_modules/@google/gemini-cli/bundle/gemini.js
REAL_CLIS := $(CLAUDE_BIN) $(CODEX_BIN) $(GEMINI_BIN)
REAL_CLI_ENV = AGENT_SERVER_TEST_CLAUDE_BIN=$(abspath $(CLAUDE_BIN)) \
	AGENT_SERVER_TEST_CODEX_BIN=$(abspath $(CODEX_BIN)) \
	AGENT_SERVER_TEST_GEMINI_BIN=$(abspath $(GEMINI_BIN))
AGENT_IMAGE ?= agent-server:dev

.PHONY: run test lint unit bench clean image conformance

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

# A CLI from npm into its own cache folder (no network beyond npm at install):
# $(call npm_cli,FOLDER,PACKAGE@VERSION,EXECUTABLE).
define npm_cli
mkdir -p $(1)
npm install --prefix $(1) --no-audit --no-fund --loglevel=error $(2)
test -x $(3)
endef

$(CLAUDE_BIN):
	$(call npm_cli,$(CLAUDE_CACHE),@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION),$@)

$(CODEX_BIN):
	$(call npm_cli,$(CODEX_CACHE),@openai/codex@$(CODEX_VERSION),$@)

$(GEMINI_BIN):
	$(call npm_cli,$(GEMINI_CACHE),@google/gemini-cli@$(GEMINI_CLI_VERSION),$@)

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
test: $(DEV_STAMP) $(REAL_CLIS) lint
	if timeout 30 docker info > /dev/null 2>&1; then $(MAKE) --no-print-directory image; fi
	$(REAL_CLI_ENV) AGENT_SERVER_TEST_IMAGE=$(AGENT_IMAGE) \
		$(BIN)/pytest --cov --cov-report=term:skip-covered

# The three CLIs' outcomes against the contract table (part of `make test` with the pins):
# `make conformance CLAUDE_CODE_VERSION=2.1.332 CODEX_VERSION=… GEMINI_CLI_VERSION=…`
# installs those releases into their own .cache folders and judges them in one command.
conformance: $(DEV_STAMP) $(REAL_CLIS)
	@for cli in $(REAL_CLIS); do echo "conformance: $$cli $$($$cli --version)"; done
	$(REAL_CLI_ENV) $(BIN)/pytest -m conformance -p no:cacheprovider

bench: $(DEV_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .coverage .hypothesis
