"""The hard test of the wrapper as a protection boundary (docs/security.md): a real
wrapper process, started the way the image starts it, runs an operator that hunts for the worker
token and the wrapper's AWS credentials in its environment, in `/proc/<wrapper>/environ`,
`cmdline` and `mem`, and in every file descriptor it can reach, and finds them nowhere.

Two set-ups, both real processes:
  * `unprivileged`: the wrapper runs as an unprivileged user (as in the worker image); it cannot
    switch users, so the operator runs as that same user and only non-dumpable, the scrubbed
    environment and closed descriptors stand between them.
  * `root` (only when the tests run as root): the wrapper runs as root and runs the untrusted
    operator as a separate user, in a scratch directory of its own.

The wrapper needs an interpreter the unprivileged user can execute and code it can read, wherever
the checkout is (a mode-700 clone, root's home): `reachable_python` takes the first interpreter of
the same minor version that the user can reach (the workspace's own, else the system's
`/usr/bin/python3.X`, e.g. Debian's python3.11), and `install_workspace_package` makes a venv from
it in a world-readable temporary directory holding a non-editable copy of the worker wrapper and
its locked dependencies, so nothing the wrapper imports lies inside the checkout.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from wrapper_harness import WORKER_TOKEN, Dispatcher, Queue, run_dispatcher, spawn, wrapper_env

from taskplat.common.tokens.capability import capability_key_ring, verify_capability_token
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.devstack.users import RunAs, traversable_by
from taskplat.devstack.venvs import install_workspace_package
from taskplat.worker_wrapper.isolation import aws_session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

SNOOP = Path(__file__).with_name("isolation_snoop.py")
WRAPPER_USER = "taskplat-wrapper-test"
OPERATOR_USER = "taskplat-operator-test"
AWS_SECRET = "wrapper-aws-secret-key-9f8e7d6c5b4a"
AWS_KEY_ID = "AKIAWRAPPERTEST12345"
CONTAINER_URI = "/v2/credentials/wrapper-relative-uri-5a4b3c2d"
CAPABILITY_KEY = private_key_pem(b"\x51" * 32)


@pytest.fixture
def dispatcher(db_url: str, tmp_path: Path) -> Iterator[Dispatcher]:
    """A dispatcher that treats `snoop` tasks as untrusted and signs capability tokens."""
    extra = {
        "TASKPLAT_DISPATCHER_UNTRUSTED_OPERATORS": "snoop",
        "TASKPLAT_CAPABILITY_TOKEN_KEYS": json.dumps({"c1": CAPABILITY_KEY}),
        "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID": "c1",
    }
    with run_dispatcher(db_url, tmp_path, extra) as served:
        yield served


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
    python = str(
        install_workspace_package(
            shared_dir / "venv",
            python=reachable_python(wrapper_user),
            package="taskplat-worker-wrapper",
        )
    )
    probe = subprocess.run(
        [python, "-c", "import taskplat.worker_wrapper.isolation, taskplat.common.logging"],
        capture_output=True,
        text=True,
        cwd=shared_dir,
        user=wrapper_user.uid if wrapper_user else None,
        group=wrapper_user.gid if wrapper_user else None,
        extra_groups=[] if wrapper_user else None,
    )
    assert probe.returncode == 0, f"the wrapper user cannot import the wrapper: {probe.stderr}"
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
        # The operator got its claim's capability token, naming its own task.
        ring = capability_key_ring(
            TokenKeySettings(keys={"c1": SecretStr(CAPABILITY_KEY)}, active_kid="c1")
        )
        verified = verify_capability_token(ring, result["capability_token"], now=datetime.now(UTC))
        assert str(verified.capability.task_id) == task["task_id"]
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


@pytest.mark.skipif(os.geteuid() != 0, reason="granting capabilities needs root")
def test_a_wrapper_with_the_user_switching_capabilities_hands_over_a_private_scratch_dir(
    shared_dir: Path, wrapper_python: str, wrapper_user: RunAs | None
) -> None:
    """Not root but with only the capabilities user switching asks for (as a container given
    them runs the wrapper): each scratch directory is 0700 and owned by the operator user."""
    assert wrapper_user is not None
    operator = ensure_user(OPERATOR_USER)
    base = shared_dir / "scratch-capabilities"
    base.mkdir()
    os.chown(base, wrapper_user.uid, wrapper_user.gid)
    code = (
        "import sys; from pathlib import Path; "
        "from taskplat.worker_wrapper.isolation import OperatorIdentity, make_scratch_dir; "
        "identity = OperatorIdentity.detect(sys.argv[2]); "
        "path = make_scratch_dir(Path(sys.argv[1]), identity); "
        "print(identity is not None, path.stat().st_uid, oct(path.stat().st_mode & 0o777))"
    )
    caps = "+chown,+dac_override,+kill,+setgid,+setuid"
    argv = ["setpriv", f"--reuid={wrapper_user.uid}", f"--regid={wrapper_user.gid}"]
    argv += ["--clear-groups", f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    argv += [wrapper_python, "-c", code, str(base), operator.name]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=shared_dir, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(operator.uid), "0o700"]


def test_take_secrets_blanks_them_in_the_initial_environment_block(tmp_path: Path) -> None:
    """In a fresh process: the values are gone from os.environ and overwritten in the block
    `/proc/self/environ` reads; other variables are untouched."""
    code = (
        "import os, sys; from taskplat.worker_wrapper.isolation import take_secrets; "
        "held = take_secrets(); "
        "block = open('/proc/self/environ', 'rb').read(); "
        "sys.exit(0 if held['TASKPLAT_WORKER_TOKEN'] == sys.argv[1] "
        "and sys.argv[1].encode() not in block and b'KEEP=me' in block "
        "and 'TASKPLAT_WORKER_TOKEN' not in os.environ else 1)"
    )
    env = {"TASKPLAT_WORKER_TOKEN": WORKER_TOKEN, "KEEP": "me", "AWS_SECRET_ACCESS_KEY": "x" * 20}
    result = subprocess.run([sys.executable, "-c", code, WORKER_TOKEN], env=env, check=False)
    assert result.returncode == 0


def test_the_aws_session_uses_the_held_credentials_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "FROM-THE-ENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-environment")
    held = {"AWS_ACCESS_KEY_ID": "HELDKEY", "AWS_SECRET_ACCESS_KEY": "held-secret"}
    credentials = aws_session(held, "us-east-1").get_credentials()
    assert (credentials.access_key, credentials.secret_key) == ("HELDKEY", "held-secret")
