"""``python -m taskplat.soak``: the soak's command line (`make soak`).

Invariants: bad settings are refused (exit 2, or ``soak: error: ...`` and exit 1) before anything
starts; the soak exits 1 when a sampled series grows without bound (see `taskplat.soak.run`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from taskplat.devstack.cliargs import positive, positive_float, run, usable_dir


def _cmd_soak(args: argparse.Namespace) -> int:
    from taskplat.soak.run import SoakConfig
    from taskplat.soak.run import main as run_soak

    run_dir = usable_dir(args.dir)
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


def parser() -> argparse.ArgumentParser:
    soak = argparse.ArgumentParser(
        prog="python -m taskplat.soak",
        description="Runs a steady load (echo tasks, runs of a DAG job, records through a "
        "buffered dataset) through a private stack, samples every service's RSS, fds and "
        "threads, Postgres connections per service, dead tuples and table sizes, and exits 1 "
        "when a series grows without bound over the second half (or a service exited). Writes "
        "soak.md, soak.json and a PNG per series. See docs/operations.md, Soak.",
    )
    soak.add_argument("--rate", type=positive_float, default=200.0, help="tasks per second (200)")
    soak.add_argument(
        "--duration", type=positive_float, default=1200.0, help="seconds of load (1200)"
    )
    soak.add_argument(
        "--sample-every", type=positive_float, default=10.0, help="seconds between samples (10)"
    )
    soak.add_argument("--workers", type=positive, default=2, help="worker wrappers (2)")
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
        type=positive_float,
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
    return soak


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv, "soak")
