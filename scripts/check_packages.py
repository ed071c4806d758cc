"""Import every module of each workspace package in a virtualenv holding only that package.

Invariant: a package that imports something it does not declare fails here, because its private
environment (`uv sync --locked --package X --no-dev`) holds exactly its declared dependencies.
The worker wrapper is also checked to hold no database code (no psycopg installed), and the client
and the Lambda runtime no server code (no taskplat.common installed).
Usage: python scripts/check_packages.py <uv> <scratch dir>
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "taskplat-common": ("libs/common/src", "taskplat.common", ("db", "sqs", "cron", "tokens")),
    "taskplat-dispatcher": ("services/dispatcher/src", "taskplat.dispatcher", ()),
    "taskplat-credential-broker": (
        "services/credential-broker/src",
        "taskplat.credential_broker",
        (),
    ),
    "taskplat-query-service": ("services/query-service/src", "taskplat.query_service", ()),
    "taskplat-outbox-relay": ("services/outbox-relay/src", "taskplat.outbox_relay", ()),
    "taskplat-scheduler": ("services/scheduler/src", "taskplat.scheduler", ()),
    "taskplat-reaper": ("services/reaper/src", "taskplat.reaper", ()),
    "taskplat-sink": ("services/sink/src", "taskplat.sink", ()),
    "taskplat-worker-wrapper": ("services/worker-wrapper/src", "taskplat.worker_wrapper", ()),
    "taskplat-client": ("libs/client/src", "taskplat.client", ()),
    "taskplat-lambda-runtime": ("libs/lambda-runtime/src", "taskplat.lambda_runtime", ()),
    "taskplat-devstack": ("tools/devstack/src", "taskplat.devstack", ()),
    "taskplat-testkit": ("tools/testkit/src", "taskplat.testkit", ()),
    "taskplat-bench": ("tools/bench/src", "taskplat.bench", ()),
    "taskplat-chaos": ("tools/chaos/src", "taskplat.chaos", ()),
    "taskplat-soak": ("tools/soak/src", "taskplat.soak", ()),
}
# Modules of a package that need one of its optional extras.
EXTRA_MODULES = {
    "taskplat.common.db": "db",
    "taskplat.common.sqs": "sqs",
    "taskplat.common.cron": "cron",
    "taskplat.common.tokens": "tokens",
    "taskplat.common.http_telemetry": "http",
}

IMPORT_ALL = """
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
skip = set(sys.argv[2:])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if info.name.endswith("__main__") or any(info.name.startswith(s) for s in skip):
        continue
    importlib.import_module(info.name)
"""


def check(uv: str, scratch: Path, name: str, module: str, extras: tuple[str, ...]) -> str | None:
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(scratch / name)}
    sync = [uv, "sync", "--locked", "--package", name, "--no-dev", "--quiet"]
    for extra in extras:
        sync += ["--extra", extra]
    result = subprocess.run(sync, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return f"{name}: uv sync failed: {result.stderr.strip()}"
    python = str(scratch / name / "bin" / "python")
    skip = [prefix for prefix, extra in EXTRA_MODULES.items() if extra not in extras]
    if module != "taskplat.common":
        skip = []
    for each in module.split(","):
        result = subprocess.run(
            [python, "-c", IMPORT_ALL, each, *skip], cwd=ROOT, capture_output=True, text=True
        )
        if result.returncode != 0:
            last = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
            return f"{name}: an import fails with only its declared dependencies: {last[0]}"
    if name == "taskplat-worker-wrapper":
        probe = subprocess.run([python, "-c", "import psycopg"], capture_output=True)
        if probe.returncode == 0:
            return f"{name}: psycopg is installed in the worker's environment"
    if name in ("taskplat-client", "taskplat-lambda-runtime"):
        probe = subprocess.run([python, "-c", "import taskplat.common"], capture_output=True)
        if probe.returncode == 0:
            return f"{name}: server code (taskplat.common) is installed beside the client"
    return None


def main() -> int:
    uv, scratch = sys.argv[1], Path(sys.argv[2])
    scratch.mkdir(parents=True, exist_ok=True)
    failures = []
    for name, (_, module, extras) in PACKAGES.items():
        problem = check(uv, scratch, name, module, extras)
        print(f"{'FAIL' if problem else 'ok  '} {name}", flush=True)
        if problem:
            failures.append(problem)
    for problem in failures:
        print(problem, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
