# syntax=docker/dockerfile:1
# The image of every Python service but the worker wrapper: services/<SERVICE>/ holds the package
# taskplat-<SERVICE>, and the image runs its console script taskplat-<SERVICE>. Each
# services/<SERVICE>/Dockerfile is a symlink to this file; the worker wrapper keeps its own (it is
# the base image product teams extend: a home and scratch directory, a second user for untrusted
# operators, /opt/taskplat for their code).
#
# Build from the repository root (the build context is the uv workspace, for uv.lock), naming the
# service, the settings prefix of its listening address (<LISTEN_PREFIX>_HOST, <LISTEN_PREFIX>_PORT)
# and its port:
#   docker build -f deploy/docker/python-service.Dockerfile --build-arg SERVICE=dispatcher \
#       --build-arg LISTEN_PREFIX=TASKPLAT_DISPATCHER --build-arg PORT=8080 -t taskplat-dispatcher:<tag> .
# Name this file, not the services/<SERVICE>/Dockerfile symlink: BuildKit does not reliably follow
# a symlinked Dockerfile (moby/buildkit#2119).
# The Makefile's `images` target, deploy/docker-compose.yml and docs/deploy.md pass these
# (SERVICE, LISTEN_PREFIX, PORT): dispatcher TASKPLAT_DISPATCHER 8080; credential-broker
# TASKPLAT_BROKER 8090; outbox-relay TASKPLAT_RELAY_OPS, scheduler TASKPLAT_SCHEDULER_OPS, reaper
# TASKPLAT_REAPER_OPS and sink TASKPLAT_SINK_OPS on 9464 (the loops serve /metrics and /healthz
# on an ops port).
#
# Pinned bases: PYTHON_IMAGE is an exact patch tag; in production also pin its digest
# (`python:3.11.13-slim-bookworm@sha256:<digest>`, the digest printed by
# `docker buildx imagetools inspect python:3.11.13-slim-bookworm`). UV_VERSION must equal the
# Makefile's (tests/deploy checks both). docs/deploy.md, "Refreshing the pinned base images".
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG UV_VERSION=0.13.9
# Where uv comes from: the pinned public image, or (`make images` where it cannot be pulled) an
# image holding PyPI's uv of the same version at /uv. PYTHON_IMAGE likewise may name a Debian
# bookworm base with Debian's python3 at /usr/local/bin/python3 (docs/deploy.md, "Building images").
ARG UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}
ARG SERVICE
ARG LISTEN_PREFIX
ARG PORT=9464

FROM ${UV_IMAGE} AS uv

# ---- builder: resolve from uv.lock only, no dev dependencies, non-editable install into /app/.venv
FROM ${PYTHON_IMAGE} AS builder
ARG SERVICE
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3 \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /src
# Dependencies first (a layer that survives source edits): the lock and the manifests only.
# The optional build secret `build_ca` is a CA bundle the downloads trust (a building host behind
# a TLS-inspecting proxy passes its own); it is mounted for the RUN only, never in a layer.
COPY uv.lock pyproject.toml ./
COPY libs/common/pyproject.toml libs/common/
COPY services/${SERVICE}/pyproject.toml services/${SERVICE}/
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && uv sync --frozen --no-dev --no-install-workspace --package taskplat-${SERVICE}
# Then the code of this service and of the library, installed as wheels (no source needed later).
COPY libs/common/ libs/common/
COPY services/${SERVICE}/ services/${SERVICE}/
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && uv sync --frozen --no-dev --no-editable --package taskplat-${SERVICE}

# ---- runtime: the interpreter and the virtualenv, a non-root user, nothing else
FROM ${PYTHON_IMAGE} AS runtime
ARG SERVICE
ARG LISTEN_PREFIX
ARG PORT
# `taskplat-service` is the service's console script, so CMD needs no build argument.
RUN test -n "${SERVICE}" && test -n "${LISTEN_PREFIX}" \
    && groupadd --system --gid 10001 taskplat \
    && useradd --system --uid 10001 --gid taskplat --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin taskplat \
    && ln -s /app/.venv/bin/taskplat-${SERVICE} /usr/local/bin/taskplat-service \
    && rm -rf /usr/local/lib/python3*/site-packages/pip* /usr/local/lib/python3*/site-packages/setuptools* \
       /usr/local/lib/python3*/site-packages/wheel* /usr/local/bin/pip*
COPY --from=builder /app/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TASKPLAT_LOG_FORMAT=json \
    ${LISTEN_PREFIX}_HOST=0.0.0.0 \
    ${LISTEN_PREFIX}_PORT=${PORT} \
    TASKPLAT_HEALTHCHECK_URL=http://127.0.0.1:${PORT}/healthz
WORKDIR /app
USER 10001:10001
EXPOSE ${PORT}
# /healthz: the servers' liveness; the loops' answers 503 once the loop made no progress for
# stall_seconds (60 s by default). No curl in slim images: the standard library probes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['TASKPLAT_HEALTHCHECK_URL'], timeout=3)"]
# Last, so a new revision changes no layer above: the source revision and version (OCI labels).
ARG REVISION=unknown
ARG VERSION=dev
LABEL org.opencontainers.image.title="taskplat-${SERVICE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}"
CMD ["taskplat-service"]
