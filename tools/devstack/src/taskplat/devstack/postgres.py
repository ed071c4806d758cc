"""A private PostgreSQL cluster for development and tests.

Invariants:
- The server listens on 127.0.0.1 only (plus a unix socket inside its data directory), and
  ``pg_hba.conf`` trusts exactly those two: nothing else can connect.
- The cluster's superuser is ``taskplat`` and it owns the database ``taskplat``; the URL is
  ``postgresql://taskplat@127.0.0.1:<port>/taskplat``.
- The data directory is ``<base_dir>/data``. An initialized one is reused, so restarts keep data.
  When running as root, the server runs as an unprivileged user (see ``users``); if that user
  cannot traverse ``base_dir``, the data lives in a fresh ``/tmp/taskplat-pg-*`` directory
  (root-owned, mode 0711) and ``<base_dir>/data`` is a symlink to it.
- Server settings are passed on the command line at each start, so a restart with another port
  or ``fsync`` setting never edits files of the cluster.
- ``start()`` either returns a URL of a server that accepts connections, or stops what it
  started and raises ``DevstackError`` with the tail of the server log. ``stop()`` is
  idempotent and deletes nothing unless ``remove_data=True``.
- Backends put themselves in sessions of their own, so they are not in the postmaster's process
  group; they exit by themselves when the postmaster is gone (postmaster-death detection).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.procs import Child, read_tail, spawn, wait_until
from taskplat.devstack.users import RunAs, give_to, server_identity, traversable_by

SUPERUSER = "taskplat"
DATABASE = "taskplat"
_BINARIES = ("initdb", "postgres", "pg_ctl", "psql")
_RELOCATED_PREFIX = "taskplat-pg-"
_MAX_SOCKET_DIR = 90  # sun_path is 108 bytes, and "/.s.PGSQL.65535" needs 16 of them
_HBA = """\
# Written by taskplat.devstack: trust, but only over the unix socket and 127.0.0.1.
local   all   all                  trust
host    all   all   127.0.0.1/32   trust
"""
_CREATE_DB = (
    f"SELECT 'CREATE DATABASE {DATABASE} OWNER {SUPERUSER}' "
    f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{DATABASE}')\\gexec\n"
)


def _version_key(bin_dir: str) -> int:
    name = Path(bin_dir).parent.name
    return int(name) if name.isdigit() else -1


def postgres_bin_dir() -> Path:
    """The directory with initdb, postgres, pg_ctl and psql: ``TASKPLAT_PG_BINDIR``, then the
    directory of ``pg_ctl`` on PATH, then the newest ``/usr/lib/postgresql/*/bin``."""
    candidates: list[Path] = []
    if override := os.environ.get("TASKPLAT_PG_BINDIR"):
        candidates.append(Path(override))
    if on_path := shutil.which("pg_ctl"):
        candidates.append(Path(on_path).resolve().parent)
    candidates += [
        Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)[::-1]
    ]
    for candidate in candidates:
        if all(os.access(candidate / name, os.X_OK) for name in _BINARIES):
            return candidate
    raise DevstackError(
        "PostgreSQL server binaries (initdb, postgres, pg_ctl, psql) not found on PATH nor in "
        "/usr/lib/postgresql/*/bin: install the server (e.g. apt-get install postgresql) or set "
        "TASKPLAT_PG_BINDIR"
    )


def _clean_env() -> dict[str, str]:
    """The environment for server and client tools: no PG* variables that could redirect them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C", PGCONNECT_TIMEOUT="5")
    return env


class PrivatePostgres:
    """A PostgreSQL server of its own, in ``base_dir``, for one developer or one test session."""

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        fsync: bool = False,
        log_path: Path | None = None,
        die_with_parent: bool = False,
        start_timeout: float = 60.0,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.fsync = fsync
        self.log_path = Path(log_path).absolute() if log_path else self.base_dir / "postgres.log"
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self._requested_port = port
        self._port: int | None = None
        self._child: Child | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise DevstackError("PrivatePostgres has not been started")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self._port}/{DATABASE}"

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def data_dir(self) -> Path:
        """``<base_dir>/data`` (a symlink when the data was relocated, see the module doc)."""
        return self.base_dir / "data"

    @property
    def pid(self) -> int | None:
        """The server's pid (it leads its own process group), while this object runs it."""
        return self._child.pid if self._child is not None else None

    def is_running(self) -> bool:
        return self._child is not None and self._child.alive()

    def start(self) -> str:
        if self.is_running():
            return self.url
        bin_dir = postgres_bin_dir()
        who = server_identity()
        data = self._prepare_data_dir(who)
        if not (data / "PG_VERSION").exists():
            self._initdb(bin_dir, data, who)
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            port = self._requested_port or free_port()
            try:
                self._child = self._launch(bin_dir, data, who, port)
            except DevstackError as exc:
                lost_port_race = "could not bind" in str(exc) or "already in use" in str(exc)
                if lost_port_race and attempt + 1 < attempts:
                    continue
                raise
            self._port = port
            break
        try:
            self._create_database(bin_dir)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self, *, remove_data: bool = False, timeout: float = 30.0) -> None:
        """Fast shutdown (``pg_ctl stop -m fast``) of the server of this data directory, whoever
        started it; idempotent. If it does not go, SIGQUIT (immediate) then SIGKILL. With
        ``remove_data`` it also deletes the data directory (and its relocated parent), never the
        log file."""
        data = self._existing_data_dir()
        if data is not None and (data / "postmaster.pid").exists():
            self._pg_ctl_stop(data, timeout)
        if self._child is not None:
            if not self._child.wait(timeout):
                self._child.stop_group(sig=signal.SIGQUIT, timeout=10.0)
            self._child = None
        if remove_data:
            self._remove_data()

    def restart_immediate(self, timeout: float = 30.0) -> str:
        """Crash and restart the server this object runs: ``pg_ctl stop -m immediate`` (every
        backend ends at once, no checkpoint; the next start replays the WAL, as after a power
        cut), then a start on the same port and data. Returns the (unchanged) URL."""
        if self._child is None or self._port is None:
            raise DevstackError("PrivatePostgres is not running")
        data = self._existing_data_dir() or self.data_dir
        who = server_identity()
        argv = [
            str(postgres_bin_dir() / "pg_ctl"),
            "stop",
            "-D",
            str(data),
            "-m",
            "immediate",
            "-w",
            "-t",
            str(int(timeout)),
        ]
        self._run_tool(argv, who, "pg_ctl stop -m immediate")
        if not self._child.wait(timeout):
            self._child.stop_group(sig=signal.SIGKILL, timeout=10.0)
        self._child = self._launch(postgres_bin_dir(), data, who, self._port)
        return self.url

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- data directory ---------------------------------------------------------------------

    def _existing_data_dir(self) -> Path | None:
        link = self.data_dir
        if link.is_symlink():
            target = link.resolve()
            return target if target.is_dir() else None
        return link if link.is_dir() else None

    def _prepare_data_dir(self, who: RunAs | None) -> Path:
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            link = self.data_dir
            if link.is_symlink():
                target = link.resolve()
                if _is_our_relocation(target, who):
                    return _make_data_dir(target, who)
                link.unlink()  # its /tmp directory is gone (or is not ours): start afresh
            if link.is_dir() or who is None or traversable_by(self.base_dir, who):
                if who is not None and not traversable_by(link, who):
                    raise DevstackError(
                        f"{link} exists but user {who.name!r} cannot reach it; move it away "
                        "or run as a non-root user"
                    )
                return _make_data_dir(link, who)
            root = _relocation_root(who)
            link.symlink_to(root / "data", target_is_directory=True)
            return _make_data_dir(root / "data", who)
        except OSError as exc:
            raise DevstackError(f"cannot prepare the Postgres data directory: {exc}") from exc

    def _remove_data(self) -> None:
        link = self.data_dir
        if link.is_symlink():
            target = link.resolve()
            if target.parent.name.startswith(_RELOCATED_PREFIX):
                shutil.rmtree(target.parent, ignore_errors=True)
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link, ignore_errors=True)

    # -- server processes -------------------------------------------------------------------

    def _run_tool(
        self, argv: list[str], who: RunAs | None, what: str, stdin: str | None = None
    ) -> None:
        try:
            result = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=_clean_env(),
                cwd="/",
                user=who.uid if who else None,
                group=who.gid if who else None,
                extra_groups=[] if who else None,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevstackError(f"{what} failed: {exc}") from exc
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log:
            log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
            raise DevstackError(f"{what} failed (exit {result.returncode}):\n{output}")

    def _initdb(self, bin_dir: Path, data: Path, who: RunAs | None) -> None:
        argv = [
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-instructions",
        ]
        if not self.fsync:
            argv.append("--no-sync")
        self._run_tool(argv, who, "initdb")
        hba = data / "pg_hba.conf"
        hba.write_text(_HBA)
        give_to(hba, who)
        hba.chmod(0o600)

    def _server_argv(self, bin_dir: Path, data: Path, port: int) -> list[str]:
        socket_dir = str(data)
        if len(socket_dir) > _MAX_SOCKET_DIR or any(c in socket_dir for c in ',"\\ \t'):
            socket_dir = ""  # too long or unquotable for a unix socket: TCP only
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": socket_dir,
            "max_connections": "200",
            "timezone": "UTC",
            "log_timezone": "UTC",
        }
        if not self.fsync:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        argv = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _launch(self, bin_dir: Path, data: Path, who: RunAs | None, port: int) -> Child:
        child = spawn(
            "postgres",
            self._server_argv(bin_dir, data, port),
            log_path=self.log_path,
            env=_clean_env(),
            cwd=Path("/"),
            run_as=who,
            die_with_parent=self.die_with_parent,
            death_signal=signal.SIGINT,  # the postmaster's "fast shutdown"
        )
        try:
            wait_until(
                lambda: _accepting(data, child.pid, port), child=child, timeout=self.start_timeout
            )
        except BaseException:
            child.stop_group(sig=signal.SIGINT, timeout=10.0)
            raise
        return child

    def _create_database(self, bin_dir: Path) -> None:
        argv = [
            str(bin_dir / "psql"),
            "-X",
            "-w",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self._port),
            "-U",
            SUPERUSER,
            "-d",
            "postgres",
            "-f",
            "-",
        ]
        self._run_tool(argv, None, f"creating database {DATABASE!r}", stdin=_CREATE_DB)

    def _pg_ctl_stop(self, data: Path, timeout: float) -> None:
        who = server_identity()
        argv = [
            str(postgres_bin_dir() / "pg_ctl"),
            "stop",
            "-D",
            str(data),
            "-m",
            "fast",
            "-w",
            "-t",
            str(int(timeout)),
        ]
        try:
            self._run_tool(argv, who, "pg_ctl stop")
        except DevstackError as exc:
            if self._child is None and _pid_file_live(data):
                raise DevstackError(f"{exc}\n{read_tail(self.log_path)}") from exc
            # otherwise: no server was running (stale pid file), or ours is reaped below


def _make_data_dir(path: Path, who: RunAs | None) -> Path:
    path.mkdir(mode=0o700, exist_ok=True)
    if not (path / "PG_VERSION").exists():
        if who is not None and path.stat().st_uid != who.uid:
            if any(path.iterdir()):
                raise DevstackError(f"{path} is not empty and not owned by {who.name!r}")
            give_to(path, who)
        path.chmod(0o700)
    return path


def _relocation_root(who: RunAs) -> Path:
    for parent in (tempfile.gettempdir(), "/tmp"):
        if traversable_by(Path(parent), who):
            root = Path(tempfile.mkdtemp(prefix=_RELOCATED_PREFIX, dir=parent))
            root.chmod(0o711)
            return root
    raise DevstackError(f"no temporary directory that user {who.name!r} can traverse")


def _is_our_relocation(target: Path, who: RunAs | None) -> bool:
    """A relocated data dir is reused only if its parent is still the root-owned, non-writable
    ``taskplat-pg-*`` directory made by ``_relocation_root``."""
    parent = target.parent
    if who is None or not parent.name.startswith(_RELOCATED_PREFIX) or not parent.is_dir():
        return False
    st = parent.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_pid_file(data: Path) -> list[str]:
    try:
        return (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return []


def _accepting(data: Path, pid: int, port: int) -> bool:
    """postmaster.pid names our pid and port, and its status line (the 8th) says "ready"."""
    lines = _read_pid_file(data)
    return (
        len(lines) >= 8
        and lines[0].strip() == str(pid)
        and lines[3].strip() == str(port)
        and lines[7].strip() == "ready"
    )


def _pid_file_live(data: Path) -> bool:
    lines = _read_pid_file(data)
    if not lines or not lines[0].strip().isdigit():
        return False
    try:
        os.kill(int(lines[0]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
