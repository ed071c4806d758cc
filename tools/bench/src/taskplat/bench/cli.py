"""``python -m taskplat.bench``: the benchmark's command line (`make bench`).

Invariants: a bad size or option is a usage error (exit 2) before anything starts; other expected
failures print ``bench: error: ...`` and exit 1 (see `taskplat.devstack.cliargs.run`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from taskplat.devstack.cliargs import positive, positive_float, run, seconds_list, usable_dir


def _counts(text: str) -> list[int]:
    """A comma-separated list of positive integers."""
    return [positive(part) for part in text.split(",") if part.strip()]


def _cmd_bench(args: argparse.Namespace) -> int:
    from taskplat.bench.config import make_config
    from taskplat.bench.runner import main as run_bench

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
        "w6_sequential": args.w6_sequential,
        "w6_clients": tuple(args.w6_clients) if args.w6_clients else None,
        "w7_key_tasks": args.w7_key_tasks,
        "w7_rate_tasks": args.w7_rate_tasks,
    }
    config = make_config(
        run_dir=usable_dir(args.dir),
        results_dir=args.results.absolute(),
        runs=args.runs,
        only=args.only,
        variants=args.variant or [],
        quick=args.quick,
        submit=args.submit,
        sizes=sizes,
        command=["python", "-m", "taskplat.bench", *sys.argv[1:]],
        peers_harness=args.peers.absolute() if args.peers else None,
        postgres_blocks=args.postgres_blocks,
    )
    return run_bench(config)


def parser() -> argparse.ArgumentParser:
    bench = argparse.ArgumentParser(
        prog="python -m taskplat.bench",
        description="Start a private stack (Postgres with fsync on, LocalStack SQS, every "
        "service, two worker wrappers), run the workloads, print the table and write "
        "<results>/latest.json and latest.md. Each figure is the median of --runs runs.",
    )
    bench.add_argument("--runs", type=positive, help="runs per workload (3; --quick: 1)")
    bench.add_argument(
        "--only", help="workloads to run, e.g. W1,W2 (default: W1,W2,W3,W4,W5,W6,W7)"
    )
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
    bench.add_argument(
        "--postgres-blocks",
        action="store_true",
        help="W1/W4: also Postgres's shared-buffer block hits and reads per task, by table and "
        "index (adds ~22 s to each run: the backends report their counts once a second at most, "
        "and idle ones after 10 s)",
    )
    sizes = bench.add_argument_group("sizes (defaults: the issue's; --quick shrinks them)")
    sizes.add_argument("--w1-tasks", type=positive, help="W1/W4 tasks per run (5000)")
    sizes.add_argument("--w2-tasks", type=positive, help="W2 tasks per run (500)")
    sizes.add_argument("--w2-rate", type=positive_float, help="W2 tasks per second (50)")
    sizes.add_argument("--w3-sleep", type=positive_float, help="W3 task seconds (30)")
    sizes.add_argument(
        "--w3-lease-ttls", type=seconds_list, help="W3 dispatcher lease TTLs, e.g. 5,30"
    )
    sizes.add_argument("--w4-rows", type=positive, help="W4 finished tasks prefilled (1000000)")
    sizes.add_argument("--in-flight", type=positive, help="W1/W4 requests in flight (32)")
    sizes.add_argument("--w5-records", type=positive, help="W5 records through the sinks (100000)")
    sizes.add_argument("--w6-queries", type=positive, help="W6 queries per concurrent phase (200)")
    sizes.add_argument("--w6-rows", type=positive, help="W6 rows each aggregate reads (1000)")
    sizes.add_argument(
        "--w6-sequential", type=positive, help="W6 sequential queries, and Postgres's (50)"
    )
    sizes.add_argument(
        "--w6-clients", type=_counts, help="W6 clients of each concurrent phase, e.g. 4,16"
    )
    sizes.add_argument(
        "--w7-key-tasks", type=positive, help="W7 tasks of the multi-key load (2000)"
    )
    sizes.add_argument(
        "--w7-rate-tasks", type=positive, help="W7 tasks on the rate-limited queue (1000)"
    )
    bench.set_defaults(func=_cmd_bench)
    return bench


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv, "bench")
