"""Each service's Dockerfile builds what the deployment runs, the way the issue asks.

Checked: one Dockerfile per service directory, a symlink to the one shared Python service
Dockerfile (built with the service's `SERVICE`, `LISTEN_PREFIX` and `PORT` build arguments) except
the worker wrapper's own; the Makefile's `images` target passes each service's arguments; pinned
bases (exact Python patch tag, the Makefile's uv version); a builder that syncs only this package
from uv.lock (`--frozen`, `--no-dev`, `--no-editable`) and copies only its own code and the
workspace libraries it depends on (each of them); a runtime stage that takes only the virtualenv,
runs as a non-root user and whose CMD is the package's console script; every ENV a setting the
service reads; the build context (.dockerignore) keeps what the builds copy and drops local state;
the worker base image holds no database driver; the example worker image is a valid extension of
it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import deploy_model
import pytest
from deploy_model import REPO, SPECS

SERVICE_DIRS = sorted(
    path.name for path in (REPO / "services").iterdir() if (path / "pyproject.toml").exists()
)
# The spec whose image each service directory builds (the migration task reuses the dispatcher's).
BUILT_BY = {spec.service_dir: spec for spec in SPECS.values() if spec.name != "migrate"}
EXAMPLE = REPO / "deploy" / "worker-example"


def _makefile_uv_version() -> str:
    match = re.search(r"^UV_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile pins no UV_VERSION"
    return match.group(1)


def test_every_service_directory_has_a_dockerfile() -> None:
    unspecified = set(SERVICE_DIRS) - set(BUILT_BY)
    assert not unspecified, (
        f"services/{sorted(unspecified)} have no ServiceSpec in tests/deploy/deploy_model.py "
        "(add one; the platform template may already run it, see deploy_model.UPCOMING)"
    )
    assert SERVICE_DIRS and set(SERVICE_DIRS) == set(BUILT_BY)
    shared = (REPO / deploy_model.SHARED_DOCKERFILE).resolve()
    for service_dir in SERVICE_DIRS:
        path = REPO / "services" / service_dir / "Dockerfile"
        assert path.is_file(), service_dir
        if BUILT_BY[service_dir].build_args:
            # Relative, so it holds in any checkout; builds name the shared file itself.
            assert path.is_symlink() and not Path(path.readlink()).is_absolute(), service_dir
            assert path.resolve() == shared, f"services/{service_dir}/Dockerfile -> {shared}"
        else:
            assert not path.is_symlink(), service_dir


def test_makefile_builds_every_image_with_its_arguments() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for service_dir, spec in BUILT_BY.items():
        if not spec.build_args:
            assert f"-f services/{service_dir}/Dockerfile" in makefile, service_dir
            continue
        args = " ".join(f"{name}={value}" for name, value in spec.build_args)
        assert f"IMAGE_ARGS_{service_dir} := {args}" in makefile, service_dir
    assert f"PYTHON_SERVICE_DOCKERFILE := {deploy_model.SHARED_DOCKERFILE}" in makefile
    assert "-f $(PYTHON_SERVICE_DOCKERFILE) $(addprefix --build-arg ,$(IMAGE_ARGS_$(svc)))" in (
        makefile
    )


@pytest.mark.parametrize("service_dir", SERVICE_DIRS)
def test_bases_are_pinned(service_dir: str) -> None:
    dockerfile = BUILT_BY[service_dir].parsed_dockerfile()
    python = dockerfile.args.get("PYTHON_IMAGE", "")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", python), python
    assert dockerfile.args.get("UV_VERSION") == _makefile_uv_version()
    assert [stage.name for stage in dockerfile.stages] == ["uv", "builder", "runtime"]
    # uv comes from its pinned image unless a build names another (`make images` without the
    # public registries: PyPI's uv of the same version, taskplat.devstack.images.build).
    assert dockerfile.stage("uv").base == "${UV_IMAGE}"
    assert dockerfile.args.get("UV_IMAGE") == "ghcr.io/astral-sh/uv:${UV_VERSION}"
    # Same interpreter in both stages: the virtualenv's python links to it.
    assert dockerfile.stage("builder").base == dockerfile.final.base == "${PYTHON_IMAGE}"


@pytest.mark.parametrize("service_dir", SERVICE_DIRS)
def test_builder_syncs_only_this_package_from_the_lock(service_dir: str) -> None:
    dockerfile = BUILT_BY[service_dir].parsed_dockerfile()
    builder = dockerfile.stage("builder")
    package = deploy_model.service_package(service_dir)
    syncs = [run for run in builder.all("RUN") if "uv sync" in run]
    assert syncs, "the builder runs no `uv sync`"
    for run in syncs:
        flags = run.split()
        assert {"--frozen", "--no-dev"} <= set(flags), run
        assert flags[flags.index("--package") + 1] == package, run
    assert "--no-editable" in syncs[-1].split(), "the last sync must install wheels, not links"
    assert builder.env()["UV_PROJECT_ENVIRONMENT"] == "/app/.venv"
    libs = {"libs/common"} | {f"libs/{name}" for name in _workspace_libraries(service_dir)}
    allowed = {"uv.lock", "pyproject.toml", f"services/{service_dir}/pyproject.toml"}
    allowed |= {f"services/{service_dir}/"} | {f"{lib}/pyproject.toml" for lib in libs}
    allowed |= {f"{lib}/" for lib in libs}
    copied: set[str] = set()
    for copy in builder.all("COPY"):
        if copy.startswith("--from="):
            assert copy == "--from=uv /uv /usr/local/bin/uv", copy
            continue
        *sources, _ = copy.split()
        assert set(sources) <= allowed, f"the builder copies {sources}"
        copied |= set(sources)
    # A workspace library the service depends on must be in the build, manifest and code.
    assert allowed <= copied, f"the builder does not copy {sorted(allowed - copied)}"


def _workspace_libraries(service_dir: str) -> list[str]:
    """The `libs/` directories of the workspace packages a service depends on."""
    project = deploy_model.pyproject(deploy_model.service_package(service_dir))
    sources = project.get("tool", {}).get("uv", {}).get("sources", {})
    names = [name for name, source in sources.items() if source.get("workspace")]
    found = []
    for path in (REPO / "libs").iterdir():
        manifest = path / "pyproject.toml"
        if manifest.exists() and tomllib.loads(manifest.read_text())["project"]["name"] in names:
            found.append(path.name)
    return sorted(found)


@pytest.mark.parametrize("service_dir", SERVICE_DIRS)
def test_runtime_is_the_venv_a_non_root_user_and_the_entry_point(service_dir: str) -> None:
    spec = BUILT_BY[service_dir]
    dockerfile = spec.parsed_dockerfile()
    runtime = dockerfile.final
    assert runtime.all("COPY") == ["--from=builder /app/.venv /app/.venv"]
    users = runtime.all("USER")
    assert users and re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1]), f"USER {users}"
    assert runtime.instructions[-1][0] == "CMD"
    assert dockerfile.command() == [spec.script]
    target = deploy_model.console_script_target(
        deploy_model.service_package(service_dir), spec.script
    )
    assert callable(deploy_model.resolve_target(target))
    env = runtime.env()
    assert env["PATH"].startswith("/app/.venv/bin:")
    unknown = {
        name
        for name in env
        if name not in deploy_model.PYTHON_RUNTIME_ENV | deploy_model.IMAGE_ONLY_ENV
        and name.upper() not in spec.accepted_env()
    }
    assert not unknown, f"ENV {sorted(unknown)} is read by no settings class of {spec.name}"


@pytest.mark.parametrize("service_dir", SERVICE_DIRS)
def test_health_check_probes_the_services_healthz(service_dir: str) -> None:
    spec = BUILT_BY[service_dir]
    assert spec.health_port_env, f"{spec.name} has no health endpoint in deploy_model.SPECS"
    dockerfile = spec.parsed_dockerfile()
    checks = dockerfile.final.all("HEALTHCHECK")
    assert len(checks) == 1, f"{spec.name}: {checks}"
    env = dockerfile.final.env()
    port = env[spec.health_port_env]
    url = f"http://127.0.0.1:{port}/healthz"
    if "TASKPLAT_HEALTHCHECK_URL" in env:
        assert env["TASKPLAT_HEALTHCHECK_URL"] == url
        assert "os.environ['TASKPLAT_HEALTHCHECK_URL']" in checks[0]
    else:
        assert url in checks[0]
    assert "curl" not in checks[0] and "wget" not in checks[0], "slim images have neither"
    assert dockerfile.final.all("EXPOSE") == [port]
    if spec.name == "dispatcher":
        assert env["TASKPLAT_DISPATCHER_HOST"] == "0.0.0.0"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore drops `path` (or a directory above it); `!` re-includes."""
    parts = Path(path.rstrip("/")).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!")
        for candidate in candidates:
            names = [candidate]
            if body.startswith("**/"):
                body_tail = body[3:]
                names = [
                    "/".join(candidate.split("/")[i:]) for i in range(len(candidate.split("/")))
                ]
                if any(fnmatch.fnmatchcase(name, body_tail) for name in names):
                    ignored = not negate
                continue
            if fnmatch.fnmatchcase(candidate, body):
                ignored = not negate
    return ignored


def test_build_context_keeps_what_the_builds_copy_and_drops_local_state() -> None:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for state in [
        ".venv",
        ".tools",
        ".run",
        ".cache",
        ".git",
        "tests",
        "services/dispatcher/tests",
        "libs/common/src/taskplat/common/__pycache__",
        "tools/devstack",
    ]:
        assert _ignored(state, patterns), f"{state} would be sent to the Docker daemon"
    for service_dir in SERVICE_DIRS:
        builder = BUILT_BY[service_dir].parsed_dockerfile().stage("builder")
        for copy in builder.all("COPY"):
            if copy.startswith("--from="):
                continue
            for source in copy.split()[:-1]:
                assert (REPO / source).exists(), source
                assert not _ignored(source, patterns), f".dockerignore drops {source}"
    sources = (REPO / "libs" / "common" / "src").rglob("*")
    assert not any(
        _ignored(str(p.relative_to(REPO)), patterns) for p in sources if p.suffix == ".sql"
    )


def test_worker_image_holds_no_database_driver() -> None:
    installed = deploy_model.lock_closure(deploy_model.service_package("worker-wrapper"))
    assert "boto3" in installed
    assert not {"psycopg", "psycopg-binary", "psycopg-pool"} & installed, sorted(installed)
    assert "psycopg" in deploy_model.lock_closure(deploy_model.service_package("dispatcher"))


def test_example_worker_image_extends_the_base() -> None:
    from taskplat.devstack.images.build import NODE_VERSION, PUBLIC_PYTHON

    dockerfile = deploy_model.parse_dockerfile(EXAMPLE / "Dockerfile")
    assert dockerfile.args["BASE_IMAGE"] == "", "the base image must be named (pinned) by the build"
    # A pinned Node.js (the version `make images` fetches where the node image cannot be pulled)
    # and the same Debian release as the base for the build stage.
    assert dockerfile.args["NODE_VERSION"] == NODE_VERSION
    assert dockerfile.args["NODE_IMAGE"] == "node:${NODE_VERSION}-bookworm-slim"
    assert dockerfile.args["PYTHON_IMAGE"] == PUBLIC_PYTHON
    bases = [stage.base for stage in dockerfile.stages]
    assert bases == ["${NODE_IMAGE}", "${PYTHON_IMAGE}", "${BASE_IMAGE}"]
    stage = dockerfile.final
    assert not stage.all("CMD") and not stage.all("ENTRYPOINT"), "keep the base image's CMD"
    assert stage.all("USER")[-1] == "10001:10001"
    # From the build: the built operators and the node binary only.
    froms = [copy.split()[:2] for copy in stage.all("COPY") if copy.startswith("--from=")]
    assert froms == [["--from=build", "/runtime/node"], ["--from=build", "/out/"]]
    copies = {copy.split()[-1]: copy.split()[0] for copy in stage.all("COPY")}
    env = stage.env()
    operators_file = env["TASKPLAT_WORKER_OPERATORS_FILE"]
    assert copies[operators_file] == "operators.yaml"
    accepted = SPECS["worker"].accepted_env()
    assert all(name.upper() in accepted for name in env), env


def _example_operators(tmp_path: Path) -> Path:
    """The example's operators.yaml with its in-image paths of the Python operators mapped to
    this checkout."""
    dockerfile = deploy_model.parse_dockerfile(EXAMPLE / "Dockerfile")
    text = (EXAMPLE / "operators.yaml").read_text(encoding="utf-8")
    (copy,) = [copy for copy in dockerfile.final.all("COPY") if copy.startswith("operators/*.py")]
    destination = copy.split()[-1]
    text = text.replace(f"{destination}word_count.py", str(EXAMPLE / "operators/word_count.py"))
    path = tmp_path / "operators.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_operators_file_is_valid_and_its_operator_runs(tmp_path: Path) -> None:
    from taskplat.worker_wrapper.operators import load_operators

    specs = load_operators(_example_operators(tmp_path))
    assert set(specs) == {"word-count", "report", "scatter", "square", "top-words", "echo"}
    assert specs["top-words"].untrusted and specs["top-words"].mode == "per-task"
    argv = specs["word-count"].argv(sys.executable)
    assert Path(argv[1]).is_file(), argv
    task = {
        "task_id": "00000000-0000-4000-8000-000000000001",
        "attempt": 1,
        "lease_token": "t",
        "operator": "word-count",
        "queue": "default",
        "config": {"text": "the cat and the hat"},
        "inputs": [],
    }
    done = subprocess.run(
        argv, input=json.dumps(task) + "\n", capture_output=True, text=True, timeout=60, check=True
    )
    envelope = json.loads(done.stdout.strip().splitlines()[-1])
    assert envelope == {"status": "succeeded", "payload": {"words": 5, "distinct": 4}}, done.stderr


def test_deploy_guide_and_compose_build_with_the_same_arguments() -> None:
    guide = (REPO / "docs" / "how-to" / "deploy-ecs.md").read_text(encoding="utf-8")
    compose = (REPO / "deploy" / "docker-compose.yml").read_text(encoding="utf-8")
    for service_dir, spec in BUILT_BY.items():
        if not spec.build_args:
            continue
        args = spec.args
        assert f"build {service_dir} {args['LISTEN_PREFIX']} {args['PORT']}\n" in guide, service_dir
        assert f"x-build-{service_dir}: &build-{service_dir}" in compose, service_dir
