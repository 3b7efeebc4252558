# Two commands do all set-up on a fresh Debian 12/13 machine as root: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SANDBOX_INVENTORY := inventories/sandbox.py
NODE_SH := tests/sandbox/node.sh
# every test's duration of the last run, as junit files (bench/test_times.py prints the table docs/testing.md quotes)
RESULTS := test-results
# the node tier's subjects (pytest markers, tests/node/conftest.py): `make test-fast SUBJECT=lifecycle`
SUBJECTS := lifecycle endpoint monitoring model pair

.PHONY: venv sandbox-deps test test-fast unit demo demo-down readme-keys docs-keys

$(BIN)/pyinfra: pyproject.toml
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

venv: $(BIN)/pyinfra

sandbox-deps:
	$(NODE_SH) deps

# The whole suite: the unit tier with the oldest and newest pyinfra the pin allows where either is not the one
# installed (tests/pyinfra_range.py), the unit tier on every core (tests/unit_tier.py), then the node tier on sandbox
# nodes (booted and torn down by the tests), serial. A failing unit tier still runs the node tier; either fails the
# target. Ends with where the time went (every test's duration stays in $(RESULTS)/).
test: venv sandbox-deps
	rm -rf $(RESULTS)
	$(BIN)/python -m tests.pyinfra_range
	rc=0; $(BIN)/python -m tests.unit_tier || rc=1; \
	$(BIN)/python -m pytest tests/node --durations=0 --junitxml=$(RESULTS)/node.xml || rc=1; \
	$(BIN)/python bench/test_times.py; exit $$rc

# A slice check while a change is being made: the unit tier, then the node tests of one subject on nodes booted and
# converged once (every subject's slice starts with the first converge). `make test` stays the whole suite.
test-fast: venv sandbox-deps
	@case " $(SUBJECTS) " in *" $(SUBJECT) "*) ;; *) echo "usage: make test-fast SUBJECT=<one of: $(SUBJECTS)>" >&2; exit 2;; esac
	rm -rf $(RESULTS)
	$(BIN)/python -m tests.unit_tier
	$(BIN)/python -m pytest tests/node -m $(SUBJECT) --durations=0 --junitxml=$(RESULTS)/node-$(SUBJECT).xml
	$(BIN)/python bench/test_times.py

# python3-libtorrent: the swarm's engine, which tests/unit/test_swarm.py runs on loopback (as a node runs it)
unit: venv
	@/usr/bin/python3 -c 'import libtorrent' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-libtorrent >/dev/null; }
	$(NODE_SH) promtool >/dev/null
	$(NODE_SH) nginx >/dev/null
	$(NODE_SH) amtool >/dev/null
	$(BIN)/python -m tests.unit_tier

# Boot the sandbox nodes, converge them with the real entry point (it ends once every head passed the serving
# gate), audit them; leaves them running. Any failure fails the target.
demo: venv sandbox-deps
	$(BIN)/python -m tests.sandbox.nodes $(SANDBOX_INVENTORY) | while read -r name port gpus fabric driver; do $(NODE_SH) up "$$name" "$$port" "$$gpus" "$$fabric" "$$driver" </dev/null || exit 1; done
	$(BIN)/python -m tests.sandbox.nodes --manifests
	$(NODE_SH) listener
	$(BIN)/pyinfra -y $(SANDBOX_INVENTORY) deploys/all.py
	AUDIT_INVENTORY=$(SANDBOX_INVENTORY) $(BIN)/python -m pytest -q tests/audit
	@echo "Serving smoke against the real vLLM on every head (the converge already passed it):"
	AUDIT_INVENTORY=$(SANDBOX_INVENTORY) $(BIN)/python -m pytest -q -rA tests/audit -m serving
	@echo
	@echo "Each head's authenticated TLS endpoint, as a client on the LAN calls it (its key in a 0600 header file):"
	@$(BIN)/python -m tests.sandbox.nodes --endpoints $(SANDBOX_INVENTORY) | while read -r line; do echo "  $$line"; sh -c "$$line" >/dev/null || exit 1; done
	@echo
	@echo "Monitoring (Prometheus and Alertmanager on the monitoring host; the alerts active now):"
	@$(BIN)/python -m tests.sandbox.nodes --monitoring $(SANDBOX_INVENTORY)
	@echo "Alert notifications as the receiver takes them:  tail -f $${SANDBOX_DIR:-/var/tmp/inference-nodes-sandbox}/monitoring/webhook.log"
	@echo
	@echo "Sandbox nodes are running:"
	@$(BIN)/python -m tests.sandbox.nodes $(SANDBOX_INVENTORY) | while read -r name port gpus fabric driver; do echo "  $$name  ssh -F $${SANDBOX_DIR:-/var/tmp/inference-nodes-sandbox}/ssh/config $$name   (or: $(NODE_SH) ssh $$name)"; done
	@echo "Converge again:  $(BIN)/pyinfra -y $(SANDBOX_INVENTORY) deploys/all.py"
	@echo "Stop them all:   make demo-down"

demo-down:
	$(NODE_SH) down-all

# The inventory key table of docs/inventory-keys.md, regenerated from deploys/schema/ (docs-keys: the same).
readme-keys docs-keys: venv
	$(BIN)/python -m deploys.schema --update-docs docs/inventory-keys.md
