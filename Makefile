# mlsched build, demo and test entry points. CI runs `make test` (.ci/run).

SHELL       := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

GO           ?= go
MODULES      := shared dispatcher worker e2e
BIN          := bin
# Per-module `go test` timeout; the e2e module runs whole clusters.
TEST_TIMEOUT ?= 12m
# make test's fuzz runs are counted in executions, not seconds: with a
# duration, Go 1.26's fuzz coordinator can report its own deadline as a
# failure ("context deadline exceeded", no crasher; golang/go#75804, fixed
# in Go 1.27), which failed a CI run on a loaded machine. 40000 executions
# take 3-15 s here per target.
FUZZTIME     ?= 40000x
# Tests and vet build without profile-guided optimisation (make pgo): a
# profiled main package would make every package it links compile twice
# (with and without the profile), which took a CI run from 14 to 21 minutes.
# The binaries the e2e tests run come from make build, with the profiles.
TEST_GOFLAGS ?= -pgo=off
IMAGE_PREFIX ?= mlsched
IMAGE_TAG    ?= dev

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# bin/nats-server is built at the version pinned in e2e/go.mod (kept there by
# e2e/tools.go), for running a real server outside the tests.
.PHONY: build
# VERSION is what `mlsched --version` prints (default: git describe).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

build: ## build bin/dispatcher, bin/worker, bin/mlsched and bin/nats-server
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./dispatcher/cmd/dispatcher ./dispatcher/cmd/mlsched ./worker/cmd/worker
	cd e2e && $(GO) build -o ../$(BIN)/nats-server github.com/nats-io/nats-server/v2

.PHONY: run
# Built, then run (not `go run`, which exits 1 when Ctrl-C reaches it, so
# make reported an error after the demo's clean stop). DEMO_FLAGS, e.g.
# DEMO_FLAGS='-duration 30s -rate 200'.
DEMO_FLAGS ?=
run: ## the demo: embedded NATS, 1 dispatcher, 3 workers, a producer, a live table, the dashboard on :9090 (Redis if MLSCHED_REDIS_URL is set)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/mlsched-demo ./e2e/cmd/mlsched-demo
	$(BIN)/mlsched-demo $(DEMO_FLAGS)

# The tests start their own redis-server (and, for the Sentinel tests,
# redis-sentinel) on free ports; they must be installed. As root (CI) we
# install them, keeping the packages from starting services: the tests never
# use 6379 or 26379, and a stray server there would only hide bugs. Without
# redis-sentinel the Sentinel tests skip, saying why.
.PHONY: redis-server
redis-server: ## make sure redis-server and redis-sentinel are installed (installs them with apt-get when root)
	@if command -v redis-server >/dev/null 2>&1 && command -v redis-sentinel >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		if command -v redis-server >/dev/null 2>&1; then \
			echo "warning: redis-sentinel is not installed (not root or no apt-get): the Sentinel tests will skip" >&2; exit 0; \
		fi; \
		echo "error: redis-server is not installed and we cannot install it (not root, or no apt-get)." >&2; \
		echo "       The tests start their own redis-server; install it, e.g. sudo apt-get install redis-server redis-sentinel" >&2; \
		exit 1; \
	fi; \
	echo ">> installing redis-server and redis-sentinel with apt-get"; \
	prc=/usr/sbin/policy-rc.d; own_prc=0; \
	if [ ! -e $$prc ]; then printf '#!/bin/sh\nexit 101\n' > $$prc && chmod +x $$prc && own_prc=1; fi; \
	trap 'if [ $$own_prc = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server </dev/null; \
	apt-get install -y -qq --no-install-recommends redis-sentinel </dev/null || \
		echo "warning: redis-sentinel could not be installed: the Sentinel tests will skip" >&2; \
	for s in redis-server redis-sentinel; do (service $$s stop || systemctl stop $$s || true) >/dev/null 2>&1; done; \
	command -v redis-server >/dev/null || { echo "error: redis-server still not in PATH after apt-get install" >&2; exit 1; }; \
	echo ">> $$(redis-server --version)"

# The bench's river scenario (e2e/bench/river.go) runs River on Debian's
# PostgreSQL 15, started from a temporary directory on a free port like
# redis-server. As root we install it (keeping the package from starting its
# own cluster's service); otherwise make bench skips the river scenario and
# says so.
PG_BIN ?= $(or $(MLSCHED_PG_BIN),/usr/lib/postgresql/15/bin)
.PHONY: postgres
postgres: ## make sure PostgreSQL 15 is installed for the bench's river scenario (installs it with apt-get when root)
	@if [ -x $(PG_BIN)/postgres ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "warning: PostgreSQL 15 is not in $(PG_BIN) and we cannot install it (not root, or no apt-get):" >&2; \
		echo "         make bench skips the river scenario; install it, e.g. sudo apt-get install postgresql" >&2; \
		exit 0; \
	fi; \
	echo ">> installing postgresql with apt-get"; \
	prc=/usr/sbin/policy-rc.d; own_prc=0; \
	if [ ! -e $$prc ]; then printf '#!/bin/sh\nexit 101\n' > $$prc && chmod +x $$prc && own_prc=1; fi; \
	trap 'if [ $$own_prc = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql </dev/null; \
	(service postgresql stop || systemctl stop postgresql || true) >/dev/null 2>&1; \
	[ -x $(PG_BIN)/postgres ] || { echo "error: $(PG_BIN)/postgres still missing after apt-get install postgresql (set PG_BIN or MLSCHED_PG_BIN)" >&2; exit 1; }; \
	echo ">> $$($(PG_BIN)/postgres --version)"

# Prometheus (its server and promtool) checks the metrics, the alert rules
# and a live scrape of a cluster. Optional: without it those tests skip with
# a message. As root we install Debian's package without starting its service.
.PHONY: prometheus
prometheus: ## install Debian's prometheus (promtool) with apt-get when root; tests skip without it
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "note: prometheus/promtool not installed (not root or no apt-get): the Prometheus tests will skip" >&2; exit 0; \
	fi; \
	echo ">> installing prometheus with apt-get"; \
	prc=/usr/sbin/policy-rc.d; own_prc=0; \
	if [ ! -e $$prc ]; then printf '#!/bin/sh\nexit 101\n' > $$prc && chmod +x $$prc && own_prc=1; fi; \
	trap 'if [ $$own_prc = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT; \
	export DEBIAN_FRONTEND=noninteractive; \
	(apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus </dev/null) || \
		echo "note: apt-get install prometheus failed: the Prometheus tests will skip" >&2; \
	(service prometheus stop || systemctl stop prometheus || true) >/dev/null 2>&1; \
	command -v promtool >/dev/null && echo ">> $$(promtool --version 2>&1 | head -1)" || true

# scikit-learn for the real-inference test (deployments/models/digits_server.py).
# Debian's package installs into /usr/bin/python3 (`python3` on PATH may be
# another interpreter without it). Optional: without it the test skips.
.PHONY: sklearn
sklearn: ## install Debian's python3-sklearn with apt-get when root; the real-inference test skips without it
	@if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sklearn' >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "note: python3-sklearn not installed (not root or no apt-get): the real-inference test will skip" >&2; exit 0; \
	fi; \
	echo ">> installing python3-sklearn with apt-get"; \
	export DEBIAN_FRONTEND=noninteractive; \
	(apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-sklearn </dev/null) || \
		echo "note: apt-get install python3-sklearn failed: the real-inference test will skip" >&2; \
	/usr/bin/python3 -c 'import sklearn; print(">> scikit-learn", sklearn.__version__)' 2>/dev/null || true

# Chromium for the dashboard test (headless, driven by chromedp). Optional:
# without it the browser test skips with a message.
.PHONY: chromium
chromium: ## install Debian's chromium with apt-get when root; the dashboard browser test skips without it
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "note: chromium not installed (not root or no apt-get): the dashboard browser test will skip" >&2; exit 0; \
	fi; \
	echo ">> installing chromium with apt-get"; \
	export DEBIAN_FRONTEND=noninteractive; \
	(apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium </dev/null) || \
		echo "note: apt-get install chromium failed: the dashboard browser test will skip" >&2; \
	command -v chromium >/dev/null && echo ">> $$(chromium --version 2>/dev/null | head -1)" || true

# The e2e tests run the binaries `make build` just made (MLSCHED_E2E_BIN),
# instead of building them again in every test package; if the build fails
# they build (and report) it themselves.
.PHONY: test
test: redis-server prometheus sklearn chromium ## vet and test (-race) every module, then a short fuzz run; prints a summary
	@declare -a summary=(); failed=0; \
	step() { local name=$$1; shift; local t0=$$SECONDS; echo ">> $$name"; \
		if "$$@"; then summary+=("PASS  $$name ($$((SECONDS-t0))s)"); last=0; \
		else summary+=("FAIL  $$name ($$((SECONDS-t0))s)"); failed=$$((failed+1)); last=1; fi; }; \
	step "tracked files under 1 MiB" bash .ci/check-large-files; \
	step "make build" $(MAKE) --no-print-directory build; \
	if [ $$last = 0 ]; then export MLSCHED_E2E_BIN=$(CURDIR)/$(BIN); fi; \
	for m in $(MODULES); do \
		step "go vet $$m" bash -c "cd $$m && $(GO) vet $(TEST_GOFLAGS) ./..."; \
		step "go test -race $$m" bash -c "cd $$m && $(GO) test $(TEST_GOFLAGS) -race -count=1 -timeout $(TEST_TIMEOUT) ./..."; \
	done; \
	if grep -qs '^func FuzzDecodeTask(' shared/protocol/*_test.go; then \
		step "fuzz FuzzDecodeTask $(FUZZTIME)" bash -c "cd shared && $(GO) test -run '^\$$' -fuzz '^FuzzDecodeTask\$$' -fuzztime $(FUZZTIME) ./protocol/"; \
	else \
		summary+=("SKIP  fuzz FuzzDecodeTask (no such fuzz target in shared/protocol yet)"); \
	fi; \
	step "doc.go path (make docpath)" $(MAKE) --no-print-directory docpath; \
	step "make compose-test" $(MAKE) --no-print-directory compose-test; \
	step "fuzz FuzzDecodeOutcome $(FUZZTIME)" bash -c "cd shared && $(GO) test -run '^\$$' -fuzz '^FuzzDecodeOutcome\$$' -fuzztime $(FUZZTIME) ./protocol/"; \
	step "fuzz FuzzEncodeResult $(FUZZTIME)" bash -c "cd shared && $(GO) test -run '^\$$' -fuzz '^FuzzEncodeResult\$$' -fuzztime $(FUZZTIME) ./protocol/"; \
	step "fuzz FuzzParseReply $(FUZZTIME)" bash -c "cd shared && $(GO) test -run '^\$$' -fuzz '^FuzzParseReply\$$' -fuzztime $(FUZZTIME) ./jsplumb/"; \
	echo; echo "==================== make test summary ===================="; \
	printf '%s\n' "$${summary[@]}"; \
	echo "==========================================================="; \
	if [ $$failed -gt 0 ]; then echo "$$failed step(s) FAILED"; exit 1; fi; \
	echo "all steps passed"

# `make bench` flags, e.g. BENCH_FLAGS='-tasks 100000 -profile -nats-sync 2m';
# see bin/mlsched-bench -h. Results go to .bench/ (git-ignored).
BENCH_FLAGS   ?=
# -auth runs relay and mlsched again with authorization (every process on its
# role's nkey from `mlsched auth init`) and reports the cost; BENCH_AUTH= skips it.
BENCH_AUTH    ?= -auth
# Hot-path go benchmarks run after the end-to-end one (paths from the
# repository root: the workspace names every module's packages).
BENCH_GO_PKGS ?= ./shared/protocol/ ./dispatcher/internal/policy/ ./dispatcher/stats/... ./shared/opshttp/ ./shared/jsplumb/

.PHONY: bench
bench: build redis-server postgres ## relay vs mlsched end to end in both modes (durable, fast), one server and a 3-server R3 cluster (tasks/s, latency, CPU, RSS), open and with authorization, River on Postgres on one server, then the hot-path go benchmarks
	@mkdir -p .bench
	$(GO) build -o $(BIN)/mlsched-bench ./e2e/cmd/mlsched-bench
	@scen=relay,mlsched,river; \
	if [ ! -x $(PG_BIN)/postgres ]; then scen=relay,mlsched; echo ">> no PostgreSQL 15 in $(PG_BIN): skipping the river scenario (make postgres as root installs it)"; fi; \
	echo "$(BIN)/mlsched-bench -bin $(BIN) -json .bench/bench-results.json -scenarios $$scen $(BENCH_AUTH) $(BENCH_FLAGS)"; \
	MLSCHED_PG_BIN=$(PG_BIN) $(BIN)/mlsched-bench -bin $(BIN) -json .bench/bench-results.json -scenarios $$scen $(BENCH_AUTH) $(BENCH_FLAGS) | tee .bench/bench-table.txt; \
	exit $${PIPESTATUS[0]}
	$(GO) test -run '^$$' -bench . -benchtime=200ms -benchmem $(BENCH_GO_PKGS) | tee .bench/go-bench.txt

# Profile-guided optimisation: go build (-pgo=auto, in make build, the
# Dockerfile and the image build alike) optimises each binary for the CPU
# profile in default.pgo beside its main package. `make pgo` refreshes the
# dispatcher's and the worker's from one fast bench run of 200 000 tasks, the
# success path they spend their time on (docs/benchmarks.md: about 6% less
# CPU per task). Commit the two files after a change to the hot path.
.PHONY: pgo
pgo: build redis-server ## refresh dispatcher/cmd/dispatcher/default.pgo and worker/cmd/worker/default.pgo from a fast bench run
	@mkdir -p .bench
	$(GO) build -o $(BIN)/mlsched-bench ./e2e/cmd/mlsched-bench
	$(BIN)/mlsched-bench -bin $(BIN) -modes fast -cluster-nodes 0 -scenarios mlsched -tasks 200000 -latency-tasks 200 \
		-profile -profile-out .bench/pgo.pprof -json ''
	cp .bench/pgo.fast-r1.pprof dispatcher/cmd/dispatcher/default.pgo
	cp .bench/pgo.fast-r1.worker.pprof worker/cmd/worker/default.pgo

# The soak (e2e/soak, docs/operations.md "Soak"): SOAK_RATE tasks/s (0: the
# highest rate this machine sustains, calibrated first) for SOAK_DURATION
# against bin/ nats-server, dispatcher, two workers and redis-server; RSS of
# every process and every stream's size sampled each second; the slopes
# after warm-up, peaks against bounds, lost/duplicates and latency per
# minute in .soak/. SOAK_FLAGS e.g. '-cluster-nodes 3' or
# '-dispatcher-env MLSCHED_RESULTS_MAX_MSGS=200000'. The ~60 s version runs
# in make test (TestSoakShort).
SOAK_RATE     ?= 0
SOAK_DURATION ?= 30m
SOAK_FLAGS    ?=
.PHONY: soak
soak: build redis-server ## sustained load: SOAK_RATE (0: highest sustained) for SOAK_DURATION (30m); every process and store must plateau
	@mkdir -p .soak
	cd e2e && $(GO) build -o ../$(BIN)/mlsched-soak ./cmd/mlsched-soak
	$(BIN)/mlsched-soak -bin $(BIN) -rate $(SOAK_RATE) -duration $(SOAK_DURATION) -json .soak/soak.json -heap .soak/nats-heap.pb.gz $(SOAK_FLAGS) | tee .soak/soak.txt

# What nats-server alone stores per second with sync_interval: always into
# 1, 2, 4 and 8 streams at once (issue 24; figures in docs/benchmarks.md).
.PHONY: fsyncprobe
fsyncprobe: build ## nats-server alone, sync_interval always: msgs/s into 1, 2, 4, 8 streams and into 1 through the group commit (how far the disk bounds durable mode)
	cd e2e && $(GO) build -o ../$(BIN)/mlsched-fsyncprobe ./cmd/mlsched-fsyncprobe
	$(BIN)/mlsched-fsyncprobe -nats-server $(BIN)/nats-server -rounds 3

# The full chaos run (e2e/chaos_test.go): 20000 tasks while worker and
# dispatcher processes are kill -9'ed and nats-server and redis-server are
# restarted. MLSCHED_CHAOS_SEED replays a run; figures in docs/chaos.md.
.PHONY: chaos
chaos: redis-server ## the full chaos test: 20000 tasks under kill -9 and server restarts (MLSCHED_CHAOS_SEED=n replays)
	cd e2e && MLSCHED_CHAOS_TASKS=$${MLSCHED_CHAOS_TASKS:-20000} $(GO) test -race=false -count=1 -run '^TestChaos$$' -v -timeout 30m ./

# The chaos run on a 3-server NATS cluster with R3 streams
# (e2e/chaos_cluster_test.go): kill -9, SIGSTOP past the election timeout,
# a partition through the harness's proxies and a rolling restart of the
# servers, plus worker and dispatcher kills. Figures in docs/chaos.md.
.PHONY: chaos-cluster
chaos-cluster: build redis-server ## the chaos test on a 3-node NATS cluster (R3): server kill/pause/partition/rolling restart, 20000 tasks
	cd e2e && MLSCHED_E2E_BIN=$(CURDIR)/$(BIN) MLSCHED_CHAOS_CLUSTER=1 MLSCHED_CHAOS_TASKS=$${MLSCHED_CHAOS_TASKS:-20000} \
		$(GO) test -race=false -count=1 -run '^TestChaosCluster$$' -v -timeout 60m ./

# dispatcher/doc.go's path of one task against the code that runs
# (e2e/docpath_test.go): builds e2e/cmd/mlsched-docpath with coverage
# counters over the project and compares the files one task runs through.
.PHONY: docpath
docpath: ## check dispatcher/doc.go's list of the files one task passes through against coverage counters of a real run
	cd e2e && MLSCHED_DOCPATH=1 $(GO) test -count=1 -run '^TestDocPathIsTheTraceOfOneTask$$' -v ./ 2>&1 | grep -v '^ *{'; exit $${PIPESTATUS[0]}

# Issue 39's registry outage under load (e2e/chaos_cluster_test.go,
# TestRegistryOutage): 12000 tasks at 200/s on the R3 cluster while the
# server leading the node registry is partitioned for 20 s; no valid task may
# fail or be rejected, and the outage must show in /readyz and /metrics.
.PHONY: registry-outage
registry-outage: build redis-server ## issue 39: a 20 s registry outage under 200 tasks/s on the R3 cluster: every task succeeds, the outage shows in /readyz and /metrics
	cd e2e && MLSCHED_E2E_BIN=$(CURDIR)/$(BIN) MLSCHED_REGISTRY_OUTAGE=1 \
		$(GO) test -race=false -count=1 -run '^TestRegistryOutage$$' -v -timeout 30m ./

# Issue 14's sequence at full size (e2e/redis_restart_test.go): 2 thompson
# dispatchers, 3 workers, 4 models failing 20/5/1/0.2%; warm-up 2000, run
# 3000, redis-server kill -9 and restart empty, run 3000; first-attempt
# success before and after, per try. RESTART_TRIES=n tries;
# RESTART_RESEED=false measures a restart without re-seeding.
RESTART_TRIES  ?= 3
RESTART_RESEED ?= true
.PHONY: redis-restart
redis-restart: build redis-server ## issue 14's Redis restart sequence at full size: first-attempt success before/after per try
	cd e2e && MLSCHED_E2E_BIN=$(CURDIR)/$(BIN) MLSCHED_RESTART_FULL=1 MLSCHED_RESTART_TRIES=$(RESTART_TRIES) \
		MLSCHED_RESTART_RESEED=$(RESTART_RESEED) $(GO) test -race=false -count=1 -run '^TestRedisRestartKeepsLearning$$' -v -timeout 60m ./ \
		| grep -v '^redis: '

# The autoscaler judged on a trace (e2e/autoscale_replay_test.go): the
# Azure code trace's first REPLAY_MINUTES at REPLAY_SPEED, once with
# mlsched autoscale's formula and once with KEDA's (ceil(lag/10), 30 s
# polling, 300 s cooldown, time-scaled alike), worker processes started and
# stopped by a process backend; p50/p99 queue wait, tasks past their
# deadline, worker-seconds, lost and duplicate results (docs/operations.md).
REPLAY_MINUTES ?= 20
REPLAY_SPEED   ?= 10
REPLAY_MAX     ?= 20
.PHONY: autoscale-replay
autoscale-replay: build ## the autoscaler vs KEDA's formula on a bursty trace, real processes: queue wait, deadlines, worker-seconds
	cd e2e && MLSCHED_E2E_BIN=$(CURDIR)/$(BIN) MLSCHED_AUTOSCALE_REPLAY=1 MLSCHED_REPLAY_MINUTES=$(REPLAY_MINUTES) MLSCHED_REPLAY_SPEED=$(REPLAY_SPEED) MLSCHED_REPLAY_MAX=$(REPLAY_MAX) \
		$(GO) test -race=false -count=1 -run '^TestAutoscaleReplay$$' -v -timeout 30m ./

# The step load (e2e/autoscale_replay_test.go, TestAutoscaleStep): idle, 5x
# one worker's capacity for STEP_SECONDS, idle; mlsched autoscale at its
# defaults, worker processes: time to enough replicas, back to the minimum.
STEP_SECONDS ?= 120
.PHONY: autoscale-step
autoscale-step: build ## the autoscaler under a step load (idle, 5x a worker's capacity for 2 min, idle): time to scale up, back to the minimum
	cd e2e && MLSCHED_E2E_BIN=$(CURDIR)/$(BIN) MLSCHED_AUTOSCALE_STEP=1 MLSCHED_STEP_SECONDS=$(STEP_SECONDS) \
		$(GO) test -race=false -count=1 -run '^TestAutoscaleStep$$' -v -timeout 20m ./

# The compose deployment's secrets (docs/security.md): NATS in operator mode
# (operator, account and system account keys; auth.conf with their JWTs;
# creds for the dispatcher, producer and admin; the worker pool's scoped
# signing key, with which every worker replica signs its own identity), the
# dispatcher's Redis password and the Redis ACL files, in ./secrets.
# Existing secrets are kept. COMPOSE_NODES adds fixed named nodes (creds each).
COMPOSE_NODES ?=
# Another directory: make secrets SECRETS_DIR=dir, and MLSCHED_SECRETS=dir for compose.
SECRETS_DIR   ?= secrets
.PHONY: secrets
secrets: ## create ./secrets for docker compose (operator-mode NATS JWTs and creds, worker pool key, Redis password and ACL); keeps existing ones
	$(GO) run ./dispatcher/cmd/mlsched auth init -compose -dir $(SECRETS_DIR) $(if $(COMPOSE_NODES),-nodes $(COMPOSE_NODES))

# Compose v2 as a docker CLI plugin, built from the Go module proxy when
# `docker compose` is missing (machines with only docker-compose 1.x).
COMPOSE_VERSION ?= v2.28.1
.PHONY: compose-plugin
compose-plugin: ## make sure `docker compose` (v2) works; builds $(COMPOSE_VERSION) into ~/.docker/cli-plugins when missing
	@COMPOSE_VERSION=$(COMPOSE_VERSION) bash deployments/images/compose-plugin.sh

# Base images from Debian's archive (debootstrap) and static Go binaries,
# then every image of docker-compose.yml from deployments/Dockerfile; cached,
# re-runnable, writes .env (deployments/images/build.sh).
.PHONY: images
images: compose-plugin ## build every compose image without a registry (debootstrap base, static binaries; cached) and write .env
	bash deployments/images/build.sh

# The compose test (e2e/compose_docker_test.go): real containers, make
# secrets, up --wait, 2000 tasks under scale 3->6->2, kill, pause, restart;
# refusals by nats-server; dashboard; Prometheus. Skips without Docker.
.PHONY: compose-test
compose-test: ## the docker compose test on real containers (runs make images first; skips without a Docker daemon)
	@if ! docker info >/dev/null 2>&1; then echo "SKIP compose-test: no Docker daemon reachable (docker info failed)"; exit 0; fi; \
	$(MAKE) --no-print-directory images && \
	cd e2e && MLSCHED_COMPOSE_TEST=1 $(GO) test -race=false -count=1 -run '^(TestComposeDocker|TestComposeAutoscale)$$' -v -timeout 30m ./

# The chaos schedule on the compose cluster (cluster.yml): NATS server kill,
# pause past the election timeout, network disconnect, rolling restart,
# worker and dispatcher kills, 20000 tasks; the Sentinel file's master kill;
# the models profile classifying digits.
.PHONY: chaos-compose
chaos-compose: images ## chaos on containers: 3 NATS servers (kill/pause/disconnect/rolling restart), worker/dispatcher kills, Redis master kill; 20000 tasks; the models profile
	cd e2e && MLSCHED_COMPOSE_TEST=1 MLSCHED_CHAOS_TASKS=$${MLSCHED_CHAOS_TASKS:-20000} $(GO) test -race=false -count=1 -run '^(TestComposeChaos|TestComposeModels)' -v -timeout 60m ./

.PHONY: docker-build
docker-build: images ## build every compose image (alias of make images)

.PHONY: clean
clean: ## remove built binaries and test artefacts
	rm -rf $(BIN)
	find . -name '*.test' -o -name '*.out' -o -name '*.prof' | xargs -r rm -f
