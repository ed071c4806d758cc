"""PrivatePostgres against the machine's real server binaries.

Invariants: every server a test starts is stopped by the test (try/finally), and every wait has a
deadline.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psycopg
import pytest

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.postgres import PrivatePostgres, postgres_bin_dir


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_bin_dir_has_the_server_binaries() -> None:
    bin_dir = postgres_bin_dir()
    for name in ("initdb", "postgres", "pg_ctl", "psql"):
        assert (bin_dir / name).exists()


def test_start_query_restart_keeps_data_stop_removes(tmp_path: Path) -> None:
    server = PrivatePostgres(tmp_path / "pg")
    url = server.start()
    try:
        assert url == f"postgresql://taskplat@127.0.0.1:{server.port}/taskplat"
        assert server.url == url
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            settings = conn.execute(
                "select current_user, current_database(), current_setting('fsync'),"
                " current_setting('synchronous_commit'), current_setting('full_page_writes'),"
                " current_setting('max_connections'), current_setting('listen_addresses')"
            ).fetchone()
            assert settings == ("taskplat", "taskplat", "off", "off", "off", "200", "127.0.0.1")
            conn.execute("create table kept (x int)")
            conn.execute("insert into kept values (42)")
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
    assert not _alive(pid)
    server.stop()  # idempotent
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()

    again = PrivatePostgres(tmp_path / "pg", fsync=True)
    url = again.start()
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("select x from kept").fetchall() == [(42,)]
            assert conn.execute("select current_setting('fsync')").fetchone() == ("on",)
    finally:
        again.stop(remove_data=True)
    assert not (tmp_path / "pg" / "data").exists()
    assert (tmp_path / "pg" / "postgres.log").exists()


def test_start_failure_raises_with_the_server_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = PrivatePostgres(tmp_path / "pg", port=port)
        with pytest.raises(DevstackError, match="Address already in use"):
            server.start()
    assert not server.is_running()
    server.stop(remove_data=True)


def test_restart_immediate_crashes_and_recovers_on_the_same_port(tmp_path: Path) -> None:
    server = PrivatePostgres(tmp_path / "pg", fsync=True)
    url = server.start()
    try:
        held = psycopg.connect(url, connect_timeout=5, autocommit=True)
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("create table kept (x int)")
            conn.execute("insert into kept values (7)")  # committed, never checkpointed
        pid = server.pid
        assert server.restart_immediate() == url
        assert server.pid != pid and server.is_running()
        assert pid is not None and not _alive(pid)
        with pytest.raises(psycopg.OperationalError):  # its backend died with the server
            held.execute("select 1")
        held.close()
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("select x from kept").fetchall() == [(7,)]
        log = server.log_path.read_text()
        assert "immediate shutdown request" in log
        assert "database system was not properly shut down" in log
    finally:
        server.stop(remove_data=True)
