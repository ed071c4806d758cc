"""``python -m taskplat.devstack``: run the local stack's servers from make or a shell.

Subcommands: ``install-localstack`` (build the cached LocalStack venv), ``postgres --dir D``
and ``sqs --dir D`` (start, print ``DATABASE_URL=...`` / ``SQS_ENDPOINT_URL=...`` on stdout, stay
in the foreground until SIGINT/SIGTERM, then stop); ``up`` (the whole platform, see
``taskplat.devstack.stack``), ``demo`` (see ``taskplat.devstack.demo``), ``bench`` (see
``taskplat.devstack.bench``) and ``chaos`` (see ``taskplat.devstack.chaos.run``; exit 1 when the
run lost a task, completed one twice or overlapped two attempts).

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
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.sqs import LocalSqs, ensure_localstack_venv

log = logging.getLogger("taskplat.devstack")


class _Server(Protocol):
    log_path: Path

    def start(self) -> str: ...

    def stop(self) -> None: ...

    def is_running(self) -> bool: ...


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 1-65535: {port}")
    return port


def _usable_dir(path: Path) -> Path:
    path = path.absolute()
    if path.exists() and not path.is_dir():
        raise DevstackError(f"--dir {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevstackError(f"cannot create --dir {path}: {exc.strerror or exc}") from exc
    return path


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
        _usable_dir(args.dir),
        port=args.port,
        fsync=args.fsync,
        log_path=args.log,
        die_with_parent=True,
    )
    log.info("postgres: data in %s, log %s", server.data_dir, server.log_path)
    return _serve(server, "DATABASE_URL")


def _cmd_sqs(args: argparse.Namespace) -> int:
    server = LocalSqs(
        _usable_dir(args.dir),
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
        _usable_dir(args.dir),
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
    from taskplat.devstack.demo import run_demo

    return run_demo(
        _usable_dir(args.dir), tasks=args.tasks, workers=args.workers, timeout=args.timeout
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    from taskplat.devstack.bench.config import make_config
    from taskplat.devstack.bench.runner import main as run_bench

    sizes = {
        "w1_tasks": args.w1_tasks,
        "w2_tasks": args.w2_tasks,
        "w2_rate": args.w2_rate,
        "w3_sleep_seconds": args.w3_sleep,
        "w3_lease_ttls": tuple(args.w3_lease_ttls) if args.w3_lease_ttls else None,
        "w4_rows": args.w4_rows,
        "in_flight": args.in_flight,
        "w5_records": args.w5_records,
        "w6_queries": args.w6_queries,
        "w6_rows": args.w6_rows,
    }
    config = make_config(
        run_dir=_usable_dir(args.dir),
        results_dir=args.results.absolute(),
        runs=args.runs,
        only=args.only,
        variants=args.variant or [],
        quick=args.quick,
        submit=args.submit,
        sizes=sizes,
        command=["python", "-m", "taskplat.devstack", *sys.argv[1:]],
        peers_harness=args.peers.absolute() if args.peers else None,
    )
    return run_bench(config)


def _cmd_chaos(args: argparse.Namespace) -> int:
    from taskplat.devstack.chaos.injector import FaultRates
    from taskplat.devstack.chaos.run import VARIANTS, ChaosConfig
    from taskplat.devstack.chaos.run import main as run_chaos

    try:
        rates = FaultRates(
            lose=args.lose,
            duplicate=args.duplicate,
            fail_receive=args.fail_receive,
            fail_delete=args.fail_delete,
        )
    except ValueError as exc:
        raise DevstackError(str(exc)) from exc
    config = ChaosConfig(
        run_dir=_usable_dir(args.dir),
        tasks=args.tasks,
        fault_seconds=args.duration,
        drain_seconds=args.drain,
        rates=rates,
        kill_every=args.kill_every,
        postgres_restarts=args.postgres_restarts,
        workers=args.workers,
        replicas=args.replicas,
        seed=args.seed,
        sqs_endpoint_url=args.sqs_endpoint_url,
    )
    variants = VARIANTS if args.variant == "both" else (args.variant,)
    return run_chaos(config, variants=variants)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, not {value}")
    return value


def _seconds_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r}") from None
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"seconds must be positive: {text!r}")
    return values


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


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
    pg.add_argument("--port", type=_port, help="TCP port on 127.0.0.1 (default: a free one)")
    pg.add_argument("--fsync", action="store_true", help="keep fsync on (default: off, fast)")
    pg.add_argument("--log", type=Path, help="server log (default <dir>/postgres.log)")
    pg.set_defaults(func=_cmd_postgres)

    sqs = sub.add_parser("sqs", help="run a local SQS endpoint in the foreground")
    sqs.add_argument("--dir", type=Path, required=True, help="state directory")
    sqs.add_argument("--port", type=_port, help="TCP port on 127.0.0.1 (default: a free one)")
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
        "--workers", type=_count, help="worker wrappers per queue (default $TASKPLAT_WORKERS or 2)"
    )
    up.add_argument("--pg-port", type=_port, help="Postgres port (default: a free one)")
    up.add_argument("--sqs-port", type=_port, help="SQS endpoint port (default: a free one)")
    up.set_defaults(func=_cmd_up)

    demo = sub.add_parser("demo", help="run the platform, submit echo tasks, summarize (make demo)")
    demo.add_argument(
        "--dir", type=Path, default=Path(".run/demo"), help="state directory (.run/demo)"
    )
    demo.add_argument("--tasks", type=_count, default=1000, help="echo tasks to submit (1000)")
    demo.add_argument("--workers", type=_count, default=2, help="worker wrappers (2)")
    demo.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the tasks (300)"
    )
    demo.set_defaults(func=_cmd_demo)
    _bench_parser(sub)
    _chaos_parser(sub)
    _soak_parser(sub)
    return parser


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench",
        help="run the benchmark on a private stack (make bench)",
        description="Start a private stack (Postgres with fsync on, LocalStack SQS, every "
        "service, two worker wrappers), run the workloads, print the table and write "
        "<results>/latest.json and latest.md. Each figure is the median of --runs runs.",
    )
    bench.add_argument("--runs", type=_positive, help="runs per workload (3; --quick: 1)")
    bench.add_argument("--only", help="workloads to run, e.g. W1,W2 (default: W1,W2,W3,W4,W5,W6)")
    bench.add_argument(
        "--variant",
        action="append",
        metavar="NAME[=ENV=VAL,...]",
        help="run the workloads under these setting overrides (repeatable; each variant gets "
        "fresh stacks), e.g. --variant baseline --variant ahead=TASKPLAT_WORKER_CLAIM_AHEAD=true",
    )
    bench.add_argument(
        "--quick", action="store_true", help="small sizes and 1 run: a smoke test of the bench"
    )
    bench.add_argument(
        "--submit",
        choices=["auto", "single", "batch"],
        default="auto",
        help="task creation: the bulk endpoint when the dispatcher has one (auto), one POST "
        "per task (single), or insist on the bulk endpoint (batch)",
    )
    bench.add_argument(
        "--dir", type=Path, default=Path(".run/bench"), help="state directory (.run/bench)"
    )
    bench.add_argument(
        "--results", type=Path, default=Path("bench/results"), help="results dir (bench/results)"
    )
    bench.add_argument(
        "--peers",
        type=Path,
        metavar="DIR",
        help="a side-by-side harness folder (setup.sh, run.sh): run it after the workloads and "
        "report the peers' figures and Taskplat's ratios (make bench PEER_BENCH=DIR)",
    )
    sizes = bench.add_argument_group("sizes (defaults: the issue's; --quick shrinks them)")
    sizes.add_argument("--w1-tasks", type=_positive, help="W1/W4 tasks per run (5000)")
    sizes.add_argument("--w2-tasks", type=_positive, help="W2 tasks per run (500)")
    sizes.add_argument("--w2-rate", type=_positive_float, help="W2 tasks per second (50)")
    sizes.add_argument("--w3-sleep", type=_positive_float, help="W3 task seconds (30)")
    sizes.add_argument(
        "--w3-lease-ttls", type=_seconds_list, help="W3 dispatcher lease TTLs, e.g. 5,30"
    )
    sizes.add_argument("--w4-rows", type=_positive, help="W4 finished tasks prefilled (1000000)")
    sizes.add_argument("--in-flight", type=_positive, help="W1/W4 requests in flight (32)")
    sizes.add_argument("--w5-records", type=_positive, help="W5 records through the sinks (100000)")
    sizes.add_argument("--w6-queries", type=_positive, help="W6 queries per run (200)")
    sizes.add_argument("--w6-rows", type=_positive, help="W6 rows each query scans (10000)")
    bench.set_defaults(func=_cmd_bench)


def _chaos_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chaos = sub.add_parser(
        "chaos",
        help="tasks through a stack under SQS faults, kills and Postgres crashes (make chaos)",
        description="Runs N tasks through a private stack while a proxy in front of SQS loses, "
        "duplicates and fails messages, services get SIGKILL and Postgres restarts in immediate "
        "mode; then prints tasks lost, completed twice and attempts that overlapped (from the "
        "database and from the operators' own records) and exits 1 on any. See docs/chaos.md.",
    )
    chaos.add_argument("--tasks", type=_positive, default=10_000, help="tasks (10000)")
    chaos.add_argument(
        "--duration", type=_positive_float, default=90.0, help="seconds of faults (90)"
    )
    chaos.add_argument(
        "--drain",
        type=_positive_float,
        default=300.0,
        help="seconds allowed, after the faults stop, for every task to complete (300)",
    )
    chaos.add_argument("--lose", type=_share, default=0.05, help="share of sends lost (0.05)")
    chaos.add_argument(
        "--duplicate", type=_share, default=0.05, help="share of sends duplicated (0.05)"
    )
    chaos.add_argument(
        "--fail-receive", type=_share, default=0.05, help="share of receives failed (0.05)"
    )
    chaos.add_argument(
        "--fail-delete", type=_share, default=0.05, help="share of deletes failed (0.05)"
    )
    chaos.add_argument(
        "--kill-every",
        type=float,
        default=5.0,
        help="mean seconds between two SIGKILLs of a random service (5; 0: none)",
    )
    chaos.add_argument(
        "--postgres-restarts", type=_count, default=2, help="immediate restarts of Postgres (2)"
    )
    chaos.add_argument("--workers", type=_positive, default=2, help="worker wrappers (2)")
    chaos.add_argument("--seed", type=int, help="random seed (default: drawn and printed)")
    chaos.add_argument(
        "--sqs-endpoint-url", help="an SQS endpoint to use (default: a private LocalStack)"
    )
    chaos.add_argument(
        "--replicas",
        type=_positive,
        default=2,
        help="processes of each of dispatcher, relay, scheduler, reaper and sink (2); the "
        "dispatchers behind a round-robin balancer",
    )
    variants = chaos.add_mutually_exclusive_group()
    variants.add_argument(
        "--variant",
        choices=["both", "waiting-claims", "no-waiting-claims"],
        default="both",
        help="both (default): the waiting-claims run, then the no-waiting-claims one; or just one",
    )
    variants.add_argument(
        "--no-waiting-claims",
        dest="variant",
        action="store_const",
        const="no-waiting-claims",
        help="only the variant without waiting claims (every task through SQS)",
    )
    chaos.add_argument(
        "--dir", type=Path, default=Path(".run/chaos"), help="state directory (.run/chaos)"
    )
    chaos.set_defaults(func=_cmd_chaos)


def _soak_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    soak = sub.add_parser(
        "soak",
        help="a steady load through a private stack, resources sampled and judged (make soak)",
        description="Runs a steady load (echo tasks, runs of a DAG job, records through a "
        "buffered dataset) through a private stack, samples every service's RSS, fds and "
        "threads, Postgres connections per service, dead tuples and table sizes, and exits 1 "
        "when a series grows without bound over the second half (or a service exited). Writes "
        "soak.md, soak.json and a PNG per series. See docs/operations.md, Soak.",
    )
    soak.add_argument("--rate", type=_positive_float, default=200.0, help="tasks per second (200)")
    soak.add_argument(
        "--duration", type=_positive_float, default=1200.0, help="seconds of load (1200)"
    )
    soak.add_argument(
        "--sample-every", type=_positive_float, default=10.0, help="seconds between samples (10)"
    )
    soak.add_argument("--workers", type=_positive, default=2, help="worker wrappers (2)")
    soak.add_argument(
        "--records-per-second",
        type=float,
        default=50.0,
        help="records published to the buffered dataset per second (50; 0: none)",
    )
    soak.add_argument(
        "--job-every",
        type=float,
        default=5.0,
        help="seconds between two runs of the DAG's produce job (5; 0: none)",
    )
    soak.add_argument(
        "--retention",
        type=_positive_float,
        help="the reaper's retention of finished tasks and sent outbox rows, seconds "
        "(default: a quarter of the duration, at most 300)",
    )
    soak.add_argument(
        "--sqs-endpoint-url", help="an SQS endpoint to use (default: a private LocalStack)"
    )
    soak.add_argument(
        "--dir", type=Path, default=Path(".run/soak"), help="state directory (.run/soak)"
    )
    soak.add_argument(
        "--report-dir", type=Path, help="where the report goes (default: <dir>/report)"
    )
    soak.set_defaults(func=_cmd_soak)


def _cmd_soak(args: argparse.Namespace) -> int:
    from taskplat.devstack.soak.run import SoakConfig
    from taskplat.devstack.soak.run import main as run_soak

    run_dir = _usable_dir(args.dir)
    config = SoakConfig(
        run_dir=run_dir,
        report_dir=args.report_dir or run_dir / "report",
        rate=args.rate,
        duration=args.duration,
        sample_every=args.sample_every,
        workers=args.workers,
        records_per_second=args.records_per_second,
        job_every=args.job_every,
        retention_seconds=args.retention,
        sqs_endpoint_url=args.sqs_endpoint_url,
    )
    return run_soak(config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="devstack: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except DevstackError as exc:
        print(f"devstack: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
