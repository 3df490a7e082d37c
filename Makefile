# Two commands on a fresh machine: `make run` serves, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CACHE := .cache/claude-code-$(CLAUDE_CODE_VERSION)
CLAUDE_BIN := $(CLAUDE_CACHE)/node_modules/@anthropic-ai/claude-code/bin/claude.exe

.PHONY: run test lint unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The real Claude Code CLI, pinned, for the end-to-end tier (no network beyond npm at install).
$(CLAUDE_BIN):
	mkdir -p $(CLAUDE_CACHE)
	npm install --prefix $(CLAUDE_CACHE) --no-audit --no-fund --loglevel=error \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	test -x $(CLAUDE_BIN)

run: $(STAMP)
	$(BIN)/agent-server serve

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

test: $(STAMP) $(CLAUDE_BIN) lint
	AGENT_SERVER_TEST_CLAUDE_BIN=$(abspath $(CLAUDE_BIN)) \
		$(BIN)/pytest --cov --cov-report=term:skip-covered

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .coverage .hypothesis
