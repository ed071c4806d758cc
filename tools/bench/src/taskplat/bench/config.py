"""What a benchmark run measures and under which settings.

Invariants:
- The services run with the production defaults of every setting that changes performance
  (`BASE_ENV` restates them, overriding the stack's faster development defaults); JSON logs at
  INFO, as deployed. A variant's overrides are layered on top, then a workload's own (W3's
  lease TTL), so a variant changes exactly the settings it names.
- The stack of a variant is never shared with another variant: each starts from a fresh,
  empty database.
- `--quick` only shrinks sizes and the number of runs; it runs the same code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from taskplat.devstack.errors import DevstackError

WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7")
LEASE_TTL = "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS"
CONCURRENCY = "TASKPLAT_WORKER_CONCURRENCY"
DEFAULT_CONCURRENCY = 8

# Production defaults of the settings that matter for speed (the stack's DEV_DEFAULTS shorten
# some of them for development), plus quiet, deployed-style logs.
BASE_ENV: Mapping[str, str] = MappingProxyType(
    {
        "TASKPLAT_LOG_FORMAT": "json",
        "TASKPLAT_LOG_LEVEL": "INFO",
        LEASE_TTL: "30",
        "TASKPLAT_REAPER_INTERVAL_SECONDS": "1",
        "TASKPLAT_REAPER_DEADLINE_GRACE_SECONDS": "30",
        "TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "0.5",
        "TASKPLAT_SCHEDULER_REQUEUE_AFTER_SECONDS": "60",
        CONCURRENCY: str(DEFAULT_CONCURRENCY),
        "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "20",
        "TASKPLAT_WORKER_VISIBILITY_TIMEOUT_SECONDS": "60",
        "TASKPLAT_WORKER_VISIBILITY_EXTENSION_SECONDS": "20",
        # Shutdown only: a quick stop of the bench's stacks.
        "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS": "5",
        "TASKPLAT_WORKER_KILL_GRACE_SECONDS": "1",
        "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS": "5",
    }
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


@dataclass(frozen=True)
class Sizes:
    w1_tasks: int = 5_000
    w2_tasks: int = 500
    w2_rate: float = 50.0
    w3_sleep_seconds: float = 30.0
    w3_kill_after_seconds: float = 2.0
    w3_lease_ttls: tuple[float, ...] = (5.0, 30.0)
    # W3 again on a stack with one worker wrapper (its own restart is the only consumer left).
    w3_one_wrapper: bool = True
    w4_rows: int = 1_000_000
    in_flight: int = 32  # W1/W4 submission: requests open at once
    batch_size: int = 100  # tasks per request when a bulk create endpoint exists
    w5_records: int = 100_000  # W5: records published to a buffered dataset
    w5_batch: int = 100  # records per SQS message
    w5_duplicates: float = 0.1  # share of records repeating a key sent before
    w6_rows: int = 1_000  # W6: rows of the buffered dataset each aggregate reads
    w6_sequential: int = 50  # W6: sequential queries (one token), and the Postgres floor's
    w6_queries: int = 200  # W6: queries per concurrent phase (a token per client)
    w6_clients: tuple[int, ...] = (4, 16)  # W6: clients of each concurrent phase
    w7_key_tasks: int = 2_000  # W7: tasks of the skewed multi-key load
    w7_keys: int = 4  # W7: concurrency keys of that load
    w7_hot_share: float = 0.7  # W7: share of its tasks on the one hot key, queued first
    w7_key_limit: int = 2  # W7: key_concurrency_limit during that load
    w7_hold_seconds: float = 0.02  # W7: each of its tasks stays Running this long
    w7_rate: float = 50.0  # W7: rate limit, starts a second
    w7_burst: int = 10  # W7: the rate limit's burst
    w7_rate_tasks: int = 1_000  # W7: tasks submitted at once on the rate-limited queue


QUICK_SIZES = Sizes(
    w1_tasks=500,
    w2_tasks=100,
    w3_sleep_seconds=6.0,
    w3_lease_ttls=(5.0,),
    w4_rows=20_000,
    w5_records=10_000,
    w6_queries=40,
    w6_sequential=20,
    w7_key_tasks=200,
    w7_rate=20.0,
    w7_burst=5,
    w7_rate_tasks=100,
)


@dataclass(frozen=True)
class Variant:
    """A named set of environment overrides for every service of the bench's stack."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


def parse_variant(text: str) -> Variant:
    """`NAME` or `NAME=ENV=VALUE,ENV2=VALUE2` (values cannot hold commas)."""
    name, _, rest = text.partition("=")
    name = name.strip()
    if not _VARIANT_NAME.match(name):
        raise DevstackError(f"bad variant name {name!r} in {text!r}: use [A-Za-z0-9_.-]")
    env: dict[str, str] = {}
    for part in filter(None, (item.strip() for item in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise DevstackError(f"bad override {part!r} in variant {name!r}: use ENV=VALUE")
        env[key] = value
    return Variant(name, env)


def parse_workloads(text: str | None) -> tuple[str, ...]:
    if not text:
        return WORKLOADS
    names = tuple(dict.fromkeys(part.strip().upper() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise DevstackError(f"unknown workload(s) {unknown or text!r}: choose from {WORKLOADS}")
    return tuple(name for name in WORKLOADS if name in names)


@dataclass(frozen=True)
class BenchConfig:
    run_dir: Path
    results_dir: Path
    runs: int = 3
    workloads: tuple[str, ...] = WORKLOADS
    variants: tuple[Variant, ...] = (Variant("default"),)
    sizes: Sizes = Sizes()
    quick: bool = False
    workers: int = 2
    submit: str = "auto"  # auto (bulk endpoint when the dispatcher has one) | single | batch
    command: tuple[str, ...] = ()
    peers_harness: Path | None = None  # the side-by-side harness run after the workloads
    # W1/W4: Postgres's shared-buffer block hits and reads per task, by table and index (each
    # run waits for the backends to report their counts, ~11 s before and after it).
    postgres_blocks: bool = False

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise DevstackError(f"--runs must be 1 or more, not {self.runs}")
        names = [variant.name for variant in self.variants]
        if len(set(names)) != len(names):
            raise DevstackError(f"variant names must differ: {names}")
        if self.submit not in ("auto", "single", "batch"):
            raise DevstackError(f"unknown submission mode {self.submit!r}")

    def stack_env(self, variant: Variant, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**BASE_ENV, **variant.env, **(extra or {})}

    def as_record(self) -> dict[str, object]:
        return {
            "runs": self.runs,
            "quick": self.quick,
            "workloads": list(self.workloads),
            "worker_wrappers": self.workers,
            "submit": self.submit,
            "sizes": {
                name: list(value) if isinstance(value, tuple) else value
                for name, value in self.sizes.__dict__.items()
            },
            "base_env": dict(BASE_ENV),
            "command": list(self.command),
            "peers_harness": str(self.peers_harness) if self.peers_harness else None,
            "postgres_blocks": self.postgres_blocks,
        }


def make_config(
    *,
    run_dir: Path,
    results_dir: Path,
    runs: int | None,
    only: str | None,
    variants: Sequence[str],
    quick: bool,
    submit: str = "auto",
    sizes: Mapping[str, object] | None = None,
    command: Sequence[str] = (),
    peers_harness: Path | None = None,
    postgres_blocks: bool = False,
) -> BenchConfig:
    """The config of `python -m taskplat.bench`; `sizes` overrides single sizes."""
    base = QUICK_SIZES if quick else Sizes()
    chosen = replace(base, **{k: v for k, v in (sizes or {}).items() if v is not None})  # type: ignore[arg-type]
    return BenchConfig(
        run_dir=run_dir,
        results_dir=results_dir,
        runs=runs if runs is not None else (1 if quick else 3),
        workloads=parse_workloads(only),
        variants=tuple(parse_variant(v) for v in variants) or (Variant("default"),),
        sizes=chosen,
        quick=quick,
        submit=submit,
        command=tuple(command),
        peers_harness=peers_harness,
        postgres_blocks=postgres_blocks,
    )
