"""``python -m taskplat.devstack``: run the local stack's servers from make or a shell.

Subcommands: ``install-localstack`` (build the cached LocalStack venv), ``postgres --dir D``
and ``sqs --dir D`` (start, print ``DATABASE_URL=...`` / ``SQS_ENDPOINT_URL=...`` on stdout, stay
in the foreground until SIGINT/SIGTERM, then stop); ``up`` (the whole platform, see
``taskplat.devstack.stack``), ``demo`` (see ``taskplat.devstack.demo.run``) and ``schema``. The
benchmark, the chaos run and the soak have their own commands (``python -m taskplat.bench``,
``taskplat.chaos``, ``taskplat.soak``).

Invariants:
- Expected failures print ``devstack: error: ...`` on stderr and exit 1 (usage errors: 2),
  never a traceback. A server that dies while in the foreground exits 1 too.
- For ``postgres`` and ``sqs`` the only line on stdout is the ``NAME=value`` line (or the venv
  python for install-localstack), flushed at once, so a process manager can read it; everything
  else goes to stderr. ``up`` prints the stack's settings and the services' prefixed output on
  stdout, its own messages on stderr.
- The servers die with this process, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

from taskplat.devstack import schema_dump
from taskplat.devstack.cliargs import count, port, run, usable_dir
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.sqs import LocalSqs, ensure_localstack_venv

log = logging.getLogger("taskplat.devstack")


class _Server(Protocol):
    log_path: Path

    def start(self) -> str: ...

    def stop(self) -> None: ...

    def is_running(self) -> bool: ...


def _serve(server: _Server, variable: str) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        value = server.start()
        print(f"{variable}={value}", flush=True)
        while not stop.wait(0.5):
            if not server.is_running():
                raise DevstackError(f"the server exited unexpectedly; see {server.log_path}")
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _cmd_install_localstack(args: argparse.Namespace) -> int:
    try:
        python = ensure_localstack_venv(args.venv, uv=args.uv)
    except DevstackError as exc:
        if not args.optional:
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(
            f"devstack: warning: LocalStack cannot be installed ({first}); the tests and the "
            "stack will use moto's server instead (installed on first use), and the test run's "
            "summary will say so",
            file=sys.stderr,
            flush=True,
        )
        return 0
    print(python, flush=True)
    return 0


def _cmd_postgres(args: argparse.Namespace) -> int:
    server = PrivatePostgres(
        usable_dir(args.dir),
        port=args.port,
        fsync=args.fsync,
        log_path=args.log,
        die_with_parent=True,
    )
    log.info("postgres: data in %s, log %s", server.data_dir, server.log_path)
    return _serve(server, "DATABASE_URL")


def _cmd_sqs(args: argparse.Namespace) -> int:
    server = LocalSqs(
        usable_dir(args.dir),
        port=args.port,
        log_path=args.log,
        die_with_parent=True,
        uv=args.uv,
        server=args.server,
    )
    log.info("sqs: state in %s, log %s", server.base_dir, server.log_path)
    return _serve(server, "SQS_ENDPOINT_URL")


def _cmd_schema(args: argparse.Namespace) -> int:
    from taskplat.common.db.migrate import apply_migrations

    with tempfile.TemporaryDirectory(prefix="taskplat-schema-") as directory:
        base = Path(directory)
        base.chmod(0o755)  # the server may run as another user
        with PrivatePostgres(base / "postgres", die_with_parent=True) as server:
            apply_migrations(server.url)
            text = schema_dump.dump_schema(server.url)
    target = schema_dump.schema_sql_path()
    target.write_text(text)
    print(f"wrote {target}", flush=True)
    return 0


def _print_line(line: str) -> None:
    print(line, flush=True)


class _Interrupted(KeyboardInterrupt):
    """SIGTERM while the stack starts: unwind like Ctrl-C."""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted


def _cmd_up(args: argparse.Namespace) -> int:
    from taskplat.devstack.stack import Stack, from_environment

    config = from_environment(
        usable_dir(args.dir),
        workers=args.workers,
        pg_port=args.pg_port,
        sqs_port=args.sqs_port,
        echo=_print_line,
    )
    stack = Stack(config)
    # While starting, Ctrl-C and SIGTERM unwind (start() then stops what it started). Set for
    # SIGINT too: a shell's background job inherits SIGINT ignored.
    starting = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        info = stack.start()
    finally:
        for sig, handler in starting.items():
            signal.signal(sig, handler)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        workers = len(config.served_queues) * config.workers
        print(
            f"Taskplat is up ({workers} worker wrapper(s), state in {config.run_dir}):",
            *(f"  {name}={value}" for name, value in info.as_env().items()),
            "Metrics and health (/metrics, /healthz; the dispatcher also has /readyz):",
            *(f"  {name}: {url}" for name, url in stack.ops_urls.items()),
            f'Try: source {info.env_file} && curl -s -X POST "$DISPATCHER_URL/tasks" '
            '-H "Authorization: Bearer $TASKPLAT_API_KEY" -H "content-type: application/json" '
            '-d \'{"operator": "echo", "config": {"hello": "world"}}\'',
            "Ctrl-C stops everything.",
            sep="\n",
            flush=True,
        )
        stop.wait()
        log.info("stopping the stack")
        return 0
    finally:
        stack.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _cmd_demo(args: argparse.Namespace) -> int:
    from taskplat.devstack.demo.run import run_demo

    return run_demo(
        usable_dir(args.dir), tasks=args.tasks, workers=args.workers, timeout=args.timeout
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskplat.devstack", description="Taskplat's local Postgres and SQS."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    install = sub.add_parser("install-localstack", help="build the cached LocalStack venv")
    install.add_argument(
        "--venv",
        type=Path,
        help="venv dir (default $TASKPLAT_LOCALSTACK_VENV or <repo>/.cache/localstack-venv)",
    )
    install.add_argument("--uv", help="uv executable (default $UV, uv on PATH, .tools/bin/uv)")
    install.add_argument(
        "--optional",
        action="store_true",
        help="when LocalStack cannot be installed (e.g. no python3.13), warn and exit 0: "
        "moto's server stands in",
    )
    install.set_defaults(func=_cmd_install_localstack)

    pg = sub.add_parser("postgres", help="run a private Postgres in the foreground")
    pg.add_argument("--dir", type=Path, required=True, help="state directory (data is kept)")
    pg.add_argument("--port", type=port, help="TCP port on 127.0.0.1 (default: a free one)")
    pg.add_argument("--fsync", action="store_true", help="keep fsync on (default: off, fast)")
    pg.add_argument("--log", type=Path, help="server log (default <dir>/postgres.log)")
    pg.set_defaults(func=_cmd_postgres)

    sqs = sub.add_parser("sqs", help="run a local SQS endpoint in the foreground")
    sqs.add_argument("--dir", type=Path, required=True, help="state directory")
    sqs.add_argument("--port", type=port, help="TCP port on 127.0.0.1 (default: a free one)")
    sqs.add_argument("--log", type=Path, help="server log (default <dir>/sqs.log)")
    sqs.add_argument(
        "--server",
        choices=["localstack", "moto"],
        help="force one server (default: LocalStack, moto as the fallback)",
    )
    sqs.add_argument("--uv", help="uv executable used to build the LocalStack venv")
    sqs.set_defaults(func=_cmd_sqs)

    sub.add_parser(
        "schema", help="write libs/common/.../db/schema.sql from the migrations (make schema)"
    ).set_defaults(func=_cmd_schema)
    up = sub.add_parser("up", help="run the whole platform in the foreground (make up)")
    up.add_argument("--dir", type=Path, default=Path(".run"), help="state directory (.run)")
    up.add_argument(
        "--workers", type=count, help="worker wrappers per queue (default $TASKPLAT_WORKERS or 2)"
    )
    up.add_argument("--pg-port", type=port, help="Postgres port (default: a free one)")
    up.add_argument("--sqs-port", type=port, help="SQS endpoint port (default: a free one)")
    up.set_defaults(func=_cmd_up)

    demo = sub.add_parser("demo", help="run the platform, submit echo tasks, summarize (make demo)")
    demo.add_argument(
        "--dir", type=Path, default=Path(".run/demo"), help="state directory (.run/demo)"
    )
    demo.add_argument("--tasks", type=count, default=1000, help="echo tasks to submit (1000)")
    demo.add_argument("--workers", type=count, default=2, help="worker wrappers (2)")
    demo.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the tasks (300)"
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(_parser(), argv, "devstack")
