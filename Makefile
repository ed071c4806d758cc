# Taskplat. `make help` lists the targets. Every target sets itself up: a pinned uv in .tools/,
# the workspace virtualenv in .venv/, and (for tests and the stack) a private Postgres and a local
# SQS endpoint started by the local runtime in tools/devstack.

SHELL := /bin/bash
.DEFAULT_GOAL := help

UV_VERSION ?= 0.13.9
UP_IMAGES_ARGS ?=
# make up-images UP_IMAGES_WORKERS=example: the workers run the example worker image
# (deploy/worker-example), untrusted operators as its second user.
UP_IMAGES_WORKERS ?= base
PYTHON ?= python3
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
RUN := $(UV) run --frozen --no-sync
PYTEST_ARGS ?= --durations=25
# `make test` runs the suite in this many processes (pytest-xdist; 0 runs it in this one), each test
# file whole in one of them, each process with its own Postgres, SQS endpoint and browser, and its
# own band of free ports (docs/reference/development.md, "Keeping the suite fast").
TEST_WORKERS ?= 2
# make bench PEER_BENCH=DIR: also run the side-by-side harness in DIR and report the peers' figures.
PEER_BENCH ?=
CHAOS_ARGS ?=
SOAK_ARGS ?=

export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export UV_PYTHON := $(PYTHON)

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(UV):
	@$(PYTHON) -m venv $(TOOLS)
	@$(TOOLS)/bin/pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(VENV)/.synced: $(UV) uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml tools/*/pyproject.toml)
	@$(UV) sync --frozen --all-packages --all-extras
	@touch $@

.PHONY: venv
venv: $(VENV)/.synced ## Create or update the virtualenv (.venv) with every package

.PHONY: lock
lock: $(UV) ## Re-resolve uv.lock after a dependency change
	@$(UV) lock

.PHONY: sqs-deps
sqs-deps: venv ## Install the local SQS endpoint (LocalStack in a Python 3.13 virtualenv; else moto)
	@$(RUN) python -m taskplat.devstack install-localstack --optional

.PHONY: up
up: venv sqs-deps ## Start the platform: Postgres, SQS, every service and TASKPLAT_WORKERS (2) workers
	@$(RUN) python -m taskplat.devstack up

.PHONY: demo
demo: venv sqs-deps ## Private stack: 1,000 echo tasks, a three-job pipeline, the same in three languages (wrapper and Lambda), an untrusted join; stop
	@$(MAKE) --no-print-directory runtimes || echo "demo: the TypeScript/Rust runtimes did not build: the three-language pipeline is skipped" >&2
	@$(RUN) python -m taskplat.devstack demo

.PHONY: bench
bench: venv sqs-deps ## Benchmark on a private stack: prints the table, writes bench/results/latest.{json,md}
	@$(RUN) python -m taskplat.bench $(if $(PEER_BENCH),--peers $(PEER_BENCH)) $(BENCH_ARGS)

.PHONY: chaos
chaos: venv sqs-deps ## Chaos run, 2 replicas, with and without waiting claims: 10,000 tasks each under SQS faults, SIGKILLs, Postgres crashes; exits 1 on loss (CHAOS_ARGS)
	@$(RUN) python -m taskplat.chaos $(CHAOS_ARGS)

.PHONY: soak
soak: venv sqs-deps ## Soak: 200 tasks/s for 20 min on a private stack; exits 1 if a resource grows (SOAK_ARGS)
	@$(RUN) python -m taskplat.soak $(SOAK_ARGS)

.PHONY: browser-deps
browser-deps: ## Install Debian's chromium and chromium-driver for the dashboard's browser tests (root)
	@scripts/install_browser.sh || [ "$$CI" != "true" ]

.PHONY: runtime-deps
runtime-deps: ## Set up the TypeScript and Rust operator runtimes' builds: Debian's librust-*-dev and cargo (root), npm ci
	@scripts/install_runtime_deps.sh || [ "$$CI" != "true" ]

.PHONY: runtimes
runtimes: runtime-deps ## Build the TypeScript (dist/) and Rust (bootstrap) operator runtimes
	@cd libs/lambda-runtime-js && npm run --silent build
	@cd libs/lambda-runtime-rs && cargo build --offline --bins

.PHONY: runtime-types
runtime-types: runtime-deps ## Regenerate the TypeScript and Rust runtimes' Task and Envelope types from the contracts' JSON Schemas (quicktype)
	@cd libs/lambda-runtime-js && npm run --silent generate-types

.PHONY: bytecode
bytecode: venv ## Compile the virtualenv's and the workspace's Python files once (the tests start hundreds of Python processes)
	@# With PYTHONDONTWRITEBYTECODE set, each of those processes would compile its imports again.
	@# Incremental; a file that does not compile only stays uncompiled (Python reports it on import).
	@$(VENV)/bin/python -m compileall -qq -j 0 $(VENV)/lib $(wildcard libs/*/src services/*/src tools/*/src) || true

.PHONY: test
test: venv bytecode sqs-deps check-packages browser-deps runtime-deps ## Run every test (starts its own Postgres, SQS endpoint and a headless Chromium; builds and tests the three operator runtimes)
	@$(RUN) pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

.PHONY: check-packages
check-packages: $(UV) ## Import each package with only its declared dependencies installed
	@$(PYTHON) scripts/check_packages.py $(UV) .cache/package-envs

.PHONY: test-fast
test-fast: venv bytecode sqs-deps browser-deps runtime-deps ## Run the unit and integration tests, not the end-to-end suite
	@$(RUN) pytest -m "not e2e" $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: venv bytecode sqs-deps runtime-deps ## Run the end-to-end suite only (every service as a real process)
	@$(RUN) pytest -m e2e $(PYTEST_ARGS)

.PHONY: docs
docs: venv ## Build the documentation site into site/ (MkDocs, --strict: a broken link or anchor, or a page left out of the nav, fails it)
	@NO_MKDOCS_2_WARNING=1 $(RUN) mkdocs build --strict

.PHONY: lint
lint: venv ## ruff and mypy --strict
	@$(RUN) ruff check .
	@$(RUN) ruff format --check .
	@$(RUN) mypy libs/common/src libs/client/src libs/lambda-runtime/src $(wildcard tools/*/src) $(wildcard services/*/src) tools/docs_site

.PHONY: deploy-check
deploy-check: venv ## cfn-lint and the policy check on every CloudFormation template (also in `make test`)
	@$(RUN) cfn-lint --include-checks I -- deploy/cloudformation/*.yaml
	@$(RUN) python tests/deploy/deploy_policy.py

.PHONY: fmt
fmt: venv ## Format the code with ruff
	@$(RUN) ruff format .
	@$(RUN) ruff check --fix .

.PHONY: migrate
migrate: venv ## Apply migrations to DATABASE_URL
	@$(RUN) taskplat-migrate

.PHONY: schema
schema: venv ## Rewrite libs/common/.../db/schema.sql (the schema the migrations leave) after a migration
	@$(RUN) python -m taskplat.devstack schema

.PHONY: migrate-status
migrate-status: venv ## List applied and pending migrations of DATABASE_URL
	@$(RUN) taskplat-migrate status

.PHONY: dispatcher
dispatcher: venv ## Run the dispatcher against DATABASE_URL (see README for its settings)
	@$(RUN) python -m taskplat.dispatcher

SERVICES := dispatcher outbox-relay scheduler reaper sink worker-wrapper credential-broker query-service
IMAGE_TAG ?= dev
# Every Python service but the worker wrapper builds from one Dockerfile (services/<dir>/Dockerfile
# is a symlink to it), named by these build arguments; the worker base image has its own.
PYTHON_SERVICE_DOCKERFILE := deploy/docker/python-service.Dockerfile
IMAGE_ARGS_dispatcher := SERVICE=dispatcher LISTEN_PREFIX=TASKPLAT_DISPATCHER PORT=8080
IMAGE_ARGS_outbox-relay := SERVICE=outbox-relay LISTEN_PREFIX=TASKPLAT_RELAY_OPS PORT=9464
IMAGE_ARGS_scheduler := SERVICE=scheduler LISTEN_PREFIX=TASKPLAT_SCHEDULER_OPS PORT=9464
IMAGE_ARGS_reaper := SERVICE=reaper LISTEN_PREFIX=TASKPLAT_REAPER_OPS PORT=9464
IMAGE_ARGS_sink := SERVICE=sink LISTEN_PREFIX=TASKPLAT_SINK_OPS PORT=9464
IMAGE_ARGS_credential-broker := SERVICE=credential-broker LISTEN_PREFIX=TASKPLAT_BROKER PORT=8090
IMAGE_ARGS_query-service := SERVICE=query-service LISTEN_PREFIX=TASKPLAT_QUERY PORT=8092

.PHONY: images-deps
images-deps: ## Install buildah, podman, runc and mmdebstrap for images without Docker (root)
	@scripts/install_image_deps.sh || [ "$$CI" != "true" ]

# make images IMAGES_ARGS=...: options of `python -m taskplat.devstack.images build` (--bases
# debian|public|auto, --refresh-base, --no-example, --no-sbom, --only <image>). The example worker
# image (deploy/worker-example, taskplat-worker-example) is built after the worker base.
IMAGES_ARGS ?=
.PHONY: images
images: venv ## Build every service image, the worker base and the example worker image: Docker where an engine answers, else buildah (SBOMs and sizes in .artifacts/images)
	@if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  if [ -n "$(IMAGES_ARGS)" ]; then \
	    echo "images: IMAGES_ARGS ($(IMAGES_ARGS)) are options of the buildah build; a Docker engine answers here, and make docker-images takes none" >&2; exit 2; \
	  fi; \
	  $(MAKE) --no-print-directory docker-images; \
	else \
	  $(RUN) python -m taskplat.devstack.images build --tag $(IMAGE_TAG) --uv-version $(UV_VERSION) $(IMAGES_ARGS); \
	fi

.PHONY: docker-images
docker-images: ## Build every service image with Docker (worker -> taskplat-worker-base), then the example worker image
	@command -v docker >/dev/null || { echo "images: the docker client is not installed" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "images: no Docker engine answers; start one first" >&2; exit 1; }
	@echo "building taskplat-worker-base:$(IMAGE_TAG)"
	@docker build -f services/worker-wrapper/Dockerfile -t taskplat-worker-base:$(IMAGE_TAG) .
	@$(foreach svc,$(filter-out worker-wrapper,$(SERVICES)),\
	  echo "building taskplat-$(svc):$(IMAGE_TAG)" && \
	  docker build -f $(PYTHON_SERVICE_DOCKERFILE) $(addprefix --build-arg ,$(IMAGE_ARGS_$(svc))) \
	    -t taskplat-$(svc):$(IMAGE_TAG) . &&) true
	@echo "building taskplat-worker-example:$(IMAGE_TAG)"
	@docker build --build-context taskplat-libs=libs --build-arg BASE_IMAGE=taskplat-worker-base:$(IMAGE_TAG) \
	  -t taskplat-worker-example:$(IMAGE_TAG) deploy/worker-example

.PHONY: up-images
up-images: venv sqs-deps ## The platform from the images with podman (Postgres and SQS on the host, each container as its ECS task definition says); Ctrl-C stops it
	@$(RUN) python -m taskplat.devstack.images up --tag $(IMAGE_TAG) \
	  $(if $(filter example,$(UP_IMAGES_WORKERS)),--example-workers) $(UP_IMAGES_ARGS)

# make test-images: the images built at HEAD (`make images`), then tests/images against them
# (hygiene, the stack from images, podman kill of each service); sizes and start-to-healthy printed.
.PHONY: test-images
test-images: images sqs-deps ## Build the images at HEAD, then test them with podman (tests/images)
	@TASKPLAT_IMAGES_TESTS=1 IMAGE_TAG=$(IMAGE_TAG) $(RUN) pytest tests/images -q -p no:cacheprovider

.PHONY: clean
clean: ## Remove the virtualenvs, caches and local stack state
	rm -rf $(VENV) $(TOOLS) .run .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis
	rm -rf libs/lambda-runtime-js/node_modules libs/lambda-runtime-js/dist libs/lambda-runtime-rs/target
