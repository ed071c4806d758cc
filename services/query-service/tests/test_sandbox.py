"""The lockdown layer on its own: statements sent straight to a prepared sandbox, no guard.

Every escape of test_escapes.py, plus reads of a real secret file, the real Postgres DSN and a
Python variable, is run in a sandbox holding one input view (`alerts`): each is refused by DuckDB
itself or answers nothing but DuckDB's own, empty, state (no secret marker in the answer, no
file written). The sandbox's process holds no variable of the service's environment, no
descriptor but its socket to the service, and serves one query.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from test_escapes import ESCAPES

from taskplat.devstack.waiting import wait_for
from taskplat.query_service import engine
from taskplat.query_service.guard import InvalidSql, Refused
from taskplat.query_service.pool import SANDBOX_ENV, Sandbox, SandboxPool, network_filtered

LIMITS = engine.Limits(
    max_rows=1000, max_bytes=1 << 20, timeout_seconds=20, memory_limit="256MB", threads=1
)
MARKER = f"secret-{uuid.uuid4().hex}"
SERVICE_SECRETS = {
    "TASKPLAT_QUERY_DATABASE_URL": f"postgresql://u:{MARKER}@db/x",
    "TASKPLAT_CAPABILITY_TOKEN_KEYS": f'{{"q1": "{MARKER}"}}',
    "AWS_ACCESS_KEY_ID": MARKER,
    "AWS_SECRET_ACCESS_KEY": MARKER,
    "AWS_SESSION_TOKEN": MARKER,
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": f"/v2/{MARKER}",
}
ALERTS = pa.table({"block": pa.array([1, 2], pa.int64()), "severity": ["low", "high"]})


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    """Sandboxes started while the service's environment holds every kind of secret."""
    saved = {name: os.environ.get(name) for name in SERVICE_SECRETS}
    os.environ.update(SERVICE_SECRETS)
    sandboxes = SandboxPool(2, LIMITS, guarded=False)
    try:
        sandboxes.start()
        wait_for(lambda: sandboxes.ready() == 2, timeout=60, what="two prepared sandboxes")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    yield sandboxes
    sandboxes.close()


def direct(pool: SandboxPool, sql: str, limits: engine.Limits = LIMITS) -> engine.Answer:
    """`sql` straight to a prepared sandbox of the unguarded pool: the lockdown alone."""
    sandbox = pool.take()
    assert sandbox.check(sql, ["alerts"], limits) == {"alerts"}
    request = {"params": None, "max_rows": 1000, "format": "json", "views": [["alerts", 0]]}
    return sandbox.run(request, [ALERTS], limits)


def contained(pool: SandboxPool, sql: str, *markers: str) -> str:
    """Run `sql` in a sandbox: refused by DuckDB, or an answer naming none of `markers`."""
    try:
        answer = direct(pool, sql)
    except engine.QueryFailed as exc:
        return exc.message
    text = answer.body.decode()
    for marker in (MARKER, *markers):
        assert marker not in text, f"{sql!r} read {marker!r}: {text[:300]}"
    return text


@pytest.mark.parametrize(("sql", "named"), ESCAPES, ids=[s for s, _ in ESCAPES])
def test_escape_attempt_without_the_guard(pool: SandboxPool, sql: str, named: str) -> None:
    values = {
        "other_uuid_view": f"dataset_{uuid.uuid4().hex}",
        "other_table": '"dataset_payroll"',
        "other_prefix": "dataset/x/version/y/",
    }
    outcome = contained(pool, sql.format(**values), "root:x:0:0")
    assert "salary" not in outcome
    assert not Path("/tmp/escape.csv").exists() and not Path("/tmp/escape").exists()


def test_files_cannot_be_read_or_written(pool: SandboxPool, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text(f"k\n{MARKER}\n")
    for sql in (
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM '{secret}'",
        f"SELECT content FROM read_text('{secret}')",
        f"SELECT * FROM glob('{tmp_path}/*')",
    ):
        assert "Permission Error" in contained(pool, sql), sql
    target = tmp_path / "out.csv"
    contained(pool, f"COPY alerts TO '{target}'")
    contained(pool, f"EXPORT DATABASE '{tmp_path / 'export'}'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv"]


def test_no_extension_loads_and_nothing_attaches(pool: SandboxPool, tmp_path: Path) -> None:
    fake = tmp_path / "x.duckdb_extension"
    fake.write_bytes(b"\0" * 64)
    for sql in (
        "LOAD httpfs",
        "LOAD postgres_scanner",
        f"LOAD '{fake}'",
        "INSTALL httpfs",
        f"ATTACH '{tmp_path / 'x.db'}' AS x",
    ):
        message = contained(pool, sql)
        assert "disabled" in message or "Permission" in message, (sql, message)
    assert not (tmp_path / "x.db").exists()


def test_settings_cannot_change(pool: SandboxPool) -> None:
    for sql in (
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "SET python_enable_replacements = true",
        "RESET lock_configuration",
        "SET lock_configuration = false",
    ):
        assert "locked" in contained(pool, sql) or "Cannot" in contained(pool, sql), sql


def test_python_variables_are_not_scanned(pool: SandboxPool) -> None:
    """No replacement scan: neither the sandbox's own variables nor a caller's Arrow table."""
    for name in ("tables", "request", "conn", "READY", "limits"):
        assert "does not exist" in contained(pool, f"SELECT * FROM {name}"), name
    conn = engine.connect(LIMITS)
    secret_table = pa.table({"k": [MARKER]})
    with pytest.raises(Exception, match="does not exist"):
        conn.sql("SELECT * FROM secret_table").fetchall()
    assert secret_table.num_rows == 1
    conn.close()


def test_the_sandbox_cannot_reach_postgres(pool: SandboxPool, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS sandbox_secret (k text)")
        conn.execute("INSERT INTO sandbox_secret VALUES (%s)", (MARKER,))
    for sql in (
        f"ATTACH '{db_url}' AS pg (TYPE postgres, READ_ONLY)",
        f"SELECT * FROM postgres_scan('{db_url}', 'public', 'sandbox_secret')",
        f"SELECT * FROM postgres_query('{db_url}', 'SELECT * FROM sandbox_secret')",
    ):
        contained(pool, sql)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(): v.decode() for k, _, v in pairs}


def _unix_inodes() -> set[str]:
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {line.split()[6] for line in lines if len(line.split()) > 6}


def test_the_sandbox_holds_no_secret_and_no_connection(pool: SandboxPool) -> None:
    sandbox = pool.take()
    try:
        assert pool.server_pid is not None
        for pid in (sandbox.pid, pool.server_pid):
            environ = _environ(pid)
            assert set(environ) == {*SANDBOX_ENV, "HOME", "TMPDIR"}, environ
            assert MARKER not in Path(f"/proc/{pid}/environ").read_text(errors="replace")
            unix = _unix_inodes()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    assert target[len("socket:[") : -1] in unix, f"{pid} holds {target}"
                else:
                    assert not target.startswith(("/", "pipe:")) or target in (
                        "/dev/null",
                        "/dev/urandom",
                    ), f"{pid} holds {target}"
    finally:
        sandbox.close()


def test_the_service_process_is_not_dumpable(pool: SandboxPool) -> None:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    assert prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE


def test_the_fork_server_does_not_load_numpy(pool: SandboxPool) -> None:
    """What the fork server maps, every fork copies: numpy (which pyarrow imports when it is
    installed, as it is here) is kept out of it, and the sandboxes answer without it."""
    assert "numpy" in sys.modules  # this process: pyarrow imported it
    assert pool.server_pid is not None
    maps = Path(f"/proc/{pool.server_pid}/maps").read_text()
    assert "/numpy" not in maps
    assert b'"rows":[[3]]' in direct(pool, "SELECT sum(block) AS s FROM alerts").body


def test_a_sandbox_serves_one_query_and_the_pool_refills(pool: SandboxPool) -> None:
    sandbox: Sandbox = pool.take()
    sandbox.check("SELECT sum(block) AS s FROM alerts", ["alerts"], LIMITS)
    request = {"params": None, "max_rows": 10, "format": "json", "views": [["alerts", 0]]}
    answer = sandbox.run(request, [ALERTS], LIMITS)
    assert b'"rows":[[3]]' in answer.body
    wait_for(
        lambda: not Path(f"/proc/{sandbox.pid}").exists(),
        timeout=10,
        what="the sandbox to exit and be reaped by the fork server",
    )
    wait_for(lambda: pool.ready() == 2, timeout=30, what="the pool to refill")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


def test_a_query_past_the_time_limit_kills_its_sandbox(pool: SandboxPool) -> None:
    short = engine.Limits(**{**LIMITS.__dict__, "timeout_seconds": 0.5})
    slow = (
        "SELECT sum(a.block + b.block + c.block) FROM alerts a, range(100000000) b(block), "
        "range(100000000) c(block)"
    )
    sandbox = pool.take()
    sandbox.check(slow, ["alerts"], short)
    request = {"params": None, "max_rows": 10, "format": "json", "views": [["alerts", 0]]}
    with pytest.raises(engine.QueryTimeout):
        sandbox.run(request, [ALERTS], short)
    wait_for(lambda: _zombie(sandbox.pid), timeout=10, what="the sandbox to be gone")


def test_no_sandbox_sees_what_another_one_left(pool: SandboxPool) -> None:
    """Each sandbox's database is its own copy of one no query used: a table, a view or a
    variable made in one is not in the next."""
    contained(pool, "CREATE TABLE left_behind AS SELECT 42 AS x")
    contained(pool, "CREATE VIEW left_view AS SELECT 42 AS x")
    contained(pool, "SET VARIABLE left_var = 42")
    for sql in ("SELECT * FROM left_behind", "SELECT * FROM left_view"):
        assert "does not exist" in contained(pool, sql), sql
    assert b"[[null]]" in direct(pool, "SELECT getvariable('left_var')").body


def test_the_guard_decides_inside_a_guarded_sandbox() -> None:
    """The service's sandboxes run the guard themselves, before they are given any input."""
    guarded = SandboxPool(0, LIMITS)
    try:
        guarded.start()
        with pytest.raises(Refused, match="read_csv"):
            guarded.take().check("SELECT * FROM read_csv('/etc/passwd')", ["alerts"], LIMITS)
        with pytest.raises(Refused, match="payroll"):
            guarded.take().check("SELECT * FROM payroll", ["alerts"], LIMITS)
        with pytest.raises(InvalidSql):
            guarded.take().check("SELEC 1", ["alerts"], LIMITS)
        sandbox = guarded.take()
        assert sandbox.check("SELECT 1 FROM alerts, prices", ["alerts", "prices", "x"], LIMITS) == {
            "alerts",
            "prices",
        }
        sandbox.close()
    finally:
        guarded.close()


def test_a_sandbox_has_no_network(pool: SandboxPool) -> None:
    """Every sandbox (and its fork server) runs under the filter that allows no socket but
    AF_UNIX; the filter itself, applied in a fresh process, refuses TCP and UDP sockets."""
    sandbox = pool.take()
    try:
        assert pool.server_pid is not None
        assert network_filtered(sandbox.pid) and network_filtered(pool.server_pid)
    finally:
        sandbox.close()
    probe = (
        "import socket, sys\n"
        "from taskplat.query_service.seccomp import deny_network\n"
        "assert deny_network()\n"
        "socket.socketpair()\n"
        "for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), "
        "(socket.AF_INET6, socket.SOCK_DGRAM), (socket.AF_NETLINK, socket.SOCK_RAW)):\n"
        "    try:\n"
        "        socket.socket(family, kind)\n"
        "    except PermissionError:\n"
        "        continue\n"
        "    sys.exit(f'{family} allowed')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_a_sandbox_starts_the_threads_it_is_given_and_is_locked_as_well() -> None:
    """DuckDB starts its worker threads in the sandbox itself (a fork keeps only the forking
    thread, so threads started in the fork server would be lost), and locks its configuration
    there before it reads a byte from the service."""
    limits = replace(LIMITS, threads=3)
    sandboxes = SandboxPool(2, limits, guarded=False)
    try:
        sandboxes.start()
        wait_for(lambda: sandboxes.ready() == 2, timeout=60, what="two prepared sandboxes")
        sandbox = sandboxes.take()
        try:
            assert _threads(sandbox.pid) >= 3  # its own thread and DuckDB's two workers
        finally:
            sandbox.close()
        answer = direct(sandboxes, "SELECT sum(block) AS total FROM alerts", limits)
        assert answer.row_count == 1
        with pytest.raises(engine.QueryFailed, match=r"locked|Cannot"):
            direct(sandboxes, "SET enable_external_access = true", limits)
    finally:
        sandboxes.close()


def test_a_single_threaded_sandbox_starts_no_thread(pool: SandboxPool) -> None:
    sandbox = pool.take()
    try:
        assert _threads(sandbox.pid) == 1
    finally:
        sandbox.close()
