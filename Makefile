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

.PHONY: help run test $(LANES) lint unit bench bench-quick clean image conformance vocabulary

# Each target's `##` comment is its line in `make help`.
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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
# configured, no `claude` on PATH) gets the pinned CLI, installed here once. Unless told
# otherwise, the agent works in a scratch workspace of the checkout (ignored by git),
# never in your home: with bypassPermissions it may do anything there.
WORKSPACE := $(abspath .cache/workspace)
run: $(RUN_STAMP) ## serve on 127.0.0.1:8000 (the agent works in .cache/workspace)
	@workdir="$${AGENT_SERVER_WORKDIR:-$(WORKSPACE)}"; mkdir -p "$$workdir"; \
	export AGENT_SERVER_WORKDIR="$$workdir" AGENT_SERVER_ENV_FILE="$${AGENT_SERVER_ENV_FILE:-$$workdir/.env}"; \
	echo "make run: the agent works in $$workdir, with full permissions there ($${AGENT_SERVER_PERMISSION_MODE:-bypassPermissions}): it runs any command it likes as $$(id -un)"; \
	case "$${AGENT_RUNTIME:-claude-code}" in claude|claude-code) claude_runtime=1;; *) claude_runtime=;; esac; \
	if [ -n "$$claude_runtime" ] && [ -z "$$AGENT_SERVER_RUNTIME_COMMAND" ] && ! command -v claude >/dev/null; then \
		$(MAKE) --no-print-directory $(CLAUDE_BIN) && \
		AGENT_SERVER_RUNTIME_COMMAND="$(abspath $(CLAUDE_BIN))" exec $(BIN)/agent-server serve; \
	else \
		exec $(BIN)/agent-server serve; \
	fi

lint: $(DEV_STAMP) ## ruff, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The redactor's word list, generated from the server's string literals and checked in.
vocabulary: $(RUN_STAMP) ## write agent_server/redaction/vocabulary.txt again (a unit test says when)
	$(BIN)/python -m agent_server.redaction.vocabulary

unit: $(DEV_STAMP) ## the unit and repository tiers only (seconds)
	$(BIN)/pytest -m "unit or repo"

# The agent image; local Debian bases when no registry has the official ones (docker/).
image: ## build the agent image (agent-server:dev)
	AGENT_IMAGE=$(AGENT_IMAGE) bash docker/build-image.sh

# The whole suite in three lanes at once, each a pytest of its own selecting tiers by
# marker, so a lane waiting on a server, a CLI or docker leaves the CPUs to the others:
#   lane-image  builds the image when a docker daemon answers, then the image tier;
#   lane-real   the unit and repository tiers, then the end-to-end tests of the real CLIs
#               (Claude Code's, and the conformance of Codex and Gemini CLI);
#   lane-fake   the other end-to-end tests (the stand-in CLIs).
# Each lane writes its own coverage data; they are combined and reported at the end.
LANES := lane-image lane-real lane-fake
PYTEST_LANE = $(REAL_CLI_ENV) AGENT_SERVER_TEST_IMAGE=$(AGENT_IMAGE) \
	COVERAGE_FILE=.coverage.$(1) $(BIN)/pytest --cov --cov-report= -p no:cacheprovider -m

test: $(DEV_STAMP) $(REAL_CLIS) lint ## lint and the whole suite, in three lanes at once
	rm -f .coverage .coverage.*
	$(MAKE) --no-print-directory -j3 --output-sync=target $(LANES)
	$(BIN)/coverage combine -q
	$(BIN)/coverage report --skip-covered

lane-image:
	if timeout 30 docker info > /dev/null 2>&1; then $(MAKE) --no-print-directory image; fi
	$(call PYTEST_LANE,image) "image and not leak_sweep"

lane-real:
	$(call PYTEST_LANE,unit) "unit or repo"
	$(call PYTEST_LANE,real) "e2e and (realcli or conformance)"

lane-fake:
	$(call PYTEST_LANE,fake) "e2e and not realcli and not conformance"

# The three CLIs' outcomes against the contract table (part of `make test` with the pins):
# `make conformance CLAUDE_CODE_VERSION=2.1.332 CODEX_VERSION=… GEMINI_CLI_VERSION=…`
# installs those releases into their own .cache folders and judges them in one command.
conformance: $(DEV_STAMP) $(REAL_CLIS) ## the three real CLIs against the contract table (any versions)
	@for cli in $(REAL_CLIS); do echo "conformance: $$cli $$($$cli --version)"; done
	$(REAL_CLI_ENV) $(BIN)/pytest -m conformance -p no:cacheprovider

bench: $(DEV_STAMP) ## every benchmark figure against its target (minutes; docs/benchmarks.md)
	$(BIN)/python -m bench

bench-quick: $(DEV_STAMP) ## the same figures, fewer rounds (about a minute)
	$(BIN)/python -m bench --quick

clean: ## remove the venv and every cache
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .coverage .hypothesis
