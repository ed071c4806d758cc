"""``python -m taskplat.chaos``: the chaos run's command line (`make chaos`).

Invariants: bad fault rates, replicas, variants or limits are refused (exit 2, or
``chaos: error: ...`` and exit 1) before anything starts; the run exits 1 when it lost a task,
completed one twice, overlapped two attempts or exceeded a queue limit it set (see
`taskplat.chaos.variants` and `taskplat.chaos.run`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from taskplat.devstack.cliargs import count, positive, positive_float, run, share, usable_dir
from taskplat.devstack.errors import DevstackError


def _cmd_chaos(args: argparse.Namespace) -> int:
    from taskplat.chaos.config import DEFAULT_VARIANTS, VARIANTS, ChaosConfig
    from taskplat.chaos.injector import FaultRates
    from taskplat.chaos.limits import ChaosLimits
    from taskplat.chaos.variants import main as run_chaos

    try:
        rates = FaultRates(
            lose=args.lose,
            duplicate=args.duplicate,
            fail_receive=args.fail_receive,
            fail_delete=args.fail_delete,
        )
    except ValueError as exc:
        raise DevstackError(str(exc)) from exc
    limits = ChaosLimits(
        concurrency_limit=args.concurrency_limit,
        key_concurrency_limit=args.key_concurrency_limit,
        rate_per_second=args.rate,
        rate_burst=args.burst,
        keys=args.keys if args.keys is not None else (4 if args.key_concurrency_limit else 0),
    )
    config = ChaosConfig(
        run_dir=usable_dir(args.dir),
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
        limits=limits,
    )
    variants = (
        DEFAULT_VARIANTS
        if args.variant == "both"
        else VARIANTS
        if args.variant == "all"
        else (args.variant,)
    )
    return run_chaos(config, variants=variants)


def parser() -> argparse.ArgumentParser:
    from taskplat.chaos.config import VARIANTS

    chaos = argparse.ArgumentParser(
        prog="python -m taskplat.chaos",
        description="Runs N tasks through a private stack while a proxy in front of SQS loses, "
        "duplicates and fails messages, services get SIGKILL and Postgres restarts in immediate "
        "mode; then prints tasks lost, completed twice and attempts that overlapped (from the "
        "database and from the operators' own records) and exits 1 on any. See docs/chaos.md.",
    )
    chaos.add_argument("--tasks", type=positive, default=10_000, help="tasks (10000)")
    chaos.add_argument(
        "--duration", type=positive_float, default=90.0, help="seconds of faults (90)"
    )
    chaos.add_argument(
        "--drain",
        type=positive_float,
        default=300.0,
        help="seconds allowed, after the faults stop, for every task to complete (300)",
    )
    chaos.add_argument("--lose", type=share, default=0.05, help="share of sends lost (0.05)")
    chaos.add_argument(
        "--duplicate", type=share, default=0.05, help="share of sends duplicated (0.05)"
    )
    chaos.add_argument(
        "--fail-receive", type=share, default=0.05, help="share of receives failed (0.05)"
    )
    chaos.add_argument(
        "--fail-delete", type=share, default=0.05, help="share of deletes failed (0.05)"
    )
    chaos.add_argument(
        "--kill-every",
        type=float,
        default=5.0,
        help="mean seconds between two SIGKILLs of a random service (5; 0: none)",
    )
    chaos.add_argument(
        "--postgres-restarts", type=count, default=2, help="immediate restarts of Postgres (2)"
    )
    chaos.add_argument("--workers", type=positive, default=2, help="worker wrappers (2)")
    chaos.add_argument("--seed", type=int, help="random seed (default: drawn and printed)")
    chaos.add_argument(
        "--sqs-endpoint-url", help="an SQS endpoint to use (default: a private LocalStack)"
    )
    chaos.add_argument(
        "--replicas",
        type=positive,
        default=2,
        help="processes of each of dispatcher, relay, scheduler, reaper and sink (2); the "
        "dispatchers behind a round-robin balancer",
    )
    limits = chaos.add_argument_group(
        "queue limits (set on the run's queue before the faults; the report checks from the "
        "attempts' own times that none was exceeded)"
    )
    limits.add_argument("--concurrency-limit", type=positive, help="tasks Running at once")
    limits.add_argument(
        "--key-concurrency-limit", type=positive, help="tasks Running at once per concurrency key"
    )
    limits.add_argument(
        "--keys",
        type=count,
        help="concurrency keys spread over the tasks (4 with --key-concurrency-limit, else 0)",
    )
    limits.add_argument("--rate", type=positive_float, help="starts a second (with --burst)")
    limits.add_argument("--burst", type=positive, help="starts at once (with --rate)")
    variants = chaos.add_mutually_exclusive_group()
    variants.add_argument(
        "--variant",
        choices=["both", "all", *VARIANTS],
        default="both",
        help="both (default): the waiting-claims run, then the no-waiting-claims one; all: those "
        "and claims-ahead (SQS with claims ahead, no waiting claims); or just one",
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
    return chaos


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv, "chaos")
