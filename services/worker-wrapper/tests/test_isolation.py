"""The hard test of the wrapper as a protection boundary (DESIGN "Runtimes and trust"): a real
wrapper process, started the way the image starts it, runs an operator that hunts for the worker
token and the wrapper's AWS credentials in its environment, in `/proc/<wrapper>/environ`,
`cmdline` and `mem`, and in every file descriptor it can reach, and finds them nowhere.

Two set-ups, both real processes:
  * `unprivileged`: the wrapper runs as an unprivileged user (as in the worker image); it cannot
    switch users, so the operator runs as that same user and only non-dumpable, the scrubbed
    environment and closed descriptors stand between them.
  * `root` (only when the tests run as root): the wrapper runs as root and runs the untrusted
    operator as a separate user, in a scratch directory of its own.

The wrapper needs an interpreter the unprivileged user can execute: the workspace venv's own
interpreter may live under /root (pyenv), which other users cannot traverse. `reachable_python`
takes the first interpreter of the same minor version that the user can reach (the workspace's
own, else the system's `/usr/bin/python3.X`, e.g. Debian's python3.11), and `uv venv` makes a
small venv from it in a world-readable temporary directory whose `.pth` adds the workspace's
site-packages (readable by all), so the wrapper runs the code under test without installing it
again.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wrapper_harness import WORKER_TOKEN, Dispatcher, Queue, spawn, wrapper_env

from taskplat.devstack.users import RunAs, traversable_by
from taskplat.devstack.venvs import find_uv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

SNOOP = Path(__file__).with_name("isolation_snoop.py")
WRAPPER_USER = "taskplat-wrapper-test"
OPERATOR_USER = "taskplat-operator-test"
AWS_SECRET = "wrapper-aws-secret-key-9f8e7d6c5b4a"
AWS_KEY_ID = "AKIAWRAPPERTEST12345"
CONTAINER_URI = "/v2/credentials/wrapper-relative-uri-5a4b3c2d"


def ensure_user(name: str) -> RunAs:
    """An unprivileged system user (created when missing; needs root)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=False,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid)


def reachable_python(who: RunAs | None) -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [
        str(Path(sys._base_executable).resolve()),  # type: ignore[attr-defined]
        f"/usr/bin/{version}",
        f"/usr/local/bin/{version}",
    ]
    for candidate in candidates:
        path = Path(candidate)
        if path.is_file() and (who is None or traversable_by(path.parent, who)):
            return candidate
    pytest.fail(f"no {version} the wrapper user can execute (install the system {version})")


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A world-readable directory for the venv, the operators file and the snoop script."""
    path = Path(tempfile.mkdtemp(prefix="taskplat-isolation-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wrapper_user() -> RunAs | None:
    return ensure_user(WRAPPER_USER) if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
def wrapper_python(shared_dir: Path, wrapper_user: RunAs | None) -> str:
    venv = shared_dir / "venv"
    subprocess.run(
        [find_uv(), "venv", "--quiet", "--no-project", "--python", reachable_python(wrapper_user),
         str(venv)],
        check=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )  # fmt: skip
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "taskplat_workspace.pth").write_text(
        f"import site; site.addsitedir({str(purelib)!r})\n"
    )
    python = str(venv / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import taskplat.worker_wrapper.isolation"], capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    return python


def write_operators(directory: Path) -> Path:
    snoop = directory / "isolation_snoop.py"
    shutil.copyfile(SNOOP, snoop)
    snoop.chmod(0o644)
    path = directory / "operators.yaml"
    path.write_text(
        "operators:\n"
        "  snoop:\n"
        f'    command: ["{{python}}", "{snoop}"]\n'
        "    env: [PATH]\n"
        "    untrusted: true\n"
    )
    path.chmod(0o644)
    return path


def run_snoop(
    dispatcher: Dispatcher,
    queue: Queue,
    directory: Path,
    python: str,
    run_as: RunAs | None,
    log_dir: Path,
    operator_user: str,
) -> dict[str, Any]:
    operators = write_operators(directory)
    scratch = directory / f"scratch-{run_as.name if run_as else 'root'}"
    scratch.mkdir()
    if run_as is not None:  # as in the image: the wrapper user owns the scratch base
        os.chown(scratch, run_as.uid, run_as.gid)
    env = {
        **wrapper_env(dispatcher, queue, operators),
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": CONTAINER_URI,
        "TASKPLAT_WORKER_OPERATOR_USER": operator_user,
        "TASKPLAT_WORKER_SCRATCH_DIR": str(scratch),
    }
    child = spawn(
        "wrapper",
        [python, "-m", "taskplat.worker_wrapper"],
        log_path=log_dir / f"wrapper-{run_as.name if run_as else 'self'}.log",
        env=env,
        cwd=directory,
        run_as=run_as,
        die_with_parent=True,
    )
    try:
        needles = [WORKER_TOKEN, AWS_SECRET, CONTAINER_URI]
        task = dispatcher.create("snoop", config={"needles": needles})
        queue.wake(task["task_id"])
        try:
            done = dispatcher.wait_status(
                task["task_id"], "Completed", "Failed", "Dead", timeout=60
            )
        except TimeoutError as exc:
            log = child.tail()
            raise AssertionError(f"the snoop task did not finish; wrapper log:\n{log}") from exc
        assert done["status"] == "Completed", (done.get("last_error"), child.tail())
        result: dict[str, Any] = done["result"]
        assert not any(scratch.iterdir()), "the scratch directory was not removed"
        return result
    finally:
        child.stop_group(timeout=10)


def assert_nothing_found(result: dict[str, Any]) -> None:
    assert result["found"] == [], result
    assert result["extra_fds"] == {}, result
    # The wrapper is non-dumpable: its /proc entries are closed to the operator.
    for place in ("parent_environ", "parent_mem", "parent_fds"):
        assert result["places"][place] in ("denied", "error 13"), (place, result)
    assert result["places"]["parent_cmdline"] == "read"  # readable, and holds no secret
    assert result["places"]["own_environ"] == "read"
    assert result["capability_token"] is None  # trusted claim: no capability token


def test_an_operator_of_an_unprivileged_wrapper_finds_no_secret(
    dispatcher: Dispatcher,
    queue: Queue,
    shared_dir: Path,
    wrapper_python: str,
    wrapper_user: RunAs | None,
    tmp_path: Path,
) -> None:
    result = run_snoop(
        dispatcher, queue, shared_dir, wrapper_python, wrapper_user, tmp_path, OPERATOR_USER
    )
    assert_nothing_found(result)
    own_uid = wrapper_user.uid if wrapper_user else os.geteuid()
    assert result["uid"] == own_uid  # it cannot switch users: same user, still nothing found
    assert result["home"] == result["cwd"] == result["tmpdir"]
    assert result["scratch_mode"] == "0o700"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_root_wrapper_runs_an_untrusted_operator_as_its_own_user(
    dispatcher: Dispatcher, queue: Queue, shared_dir: Path, wrapper_python: str, tmp_path: Path
) -> None:
    operator = ensure_user(OPERATOR_USER)
    result = run_snoop(dispatcher, queue, shared_dir, wrapper_python, None, tmp_path, operator.name)
    assert_nothing_found(result)
    assert result["uid"] == operator.uid
    assert result["scratch_owner"] == operator.uid and result["scratch_mode"] == "0o700"
    assert result["home"] == result["cwd"] == result["tmpdir"]
    assert json.dumps(result).count(WORKER_TOKEN) == 0
