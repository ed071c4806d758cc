"""The chaos run's settings: `ChaosConfig` and its variants, the ways wrappers get work: waiting
claims (the default), SQS alone, and SQS with claims ahead (without waiting claims).

Invariants: a config is checked when made (`DevstackError` naming the bad value); each variant of a
run gets its own directory and its own seed (`variant_configs`), so a variant run alone replays
its kill schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from taskplat.chaos.injector import FaultRates
from taskplat.chaos.limits import ChaosLimits
from taskplat.devstack.errors import DevstackError

WAITING_CLAIMS = "waiting-claims"
NO_WAITING_CLAIMS = "no-waiting-claims"
CLAIMS_AHEAD = "claims-ahead"
VARIANTS = (WAITING_CLAIMS, NO_WAITING_CLAIMS, CLAIMS_AHEAD)  # seeds: base + index here
DEFAULT_VARIANTS = (WAITING_CLAIMS, NO_WAITING_CLAIMS)
# The wrappers' settings of each variant. Without waiting claims, no claim bypasses SQS: no
# waiting claim and no claim ahead either. With claims ahead, a backlog is claimed from the
# dispatcher while SQS brings the wake-ups.
VARIANT_ENV: dict[str, dict[str, str]] = {
    WAITING_CLAIMS: {},
    NO_WAITING_CLAIMS: {
        "TASKPLAT_WORKER_POLL_DISPATCHER": "false",
        "TASKPLAT_WORKER_CLAIM_AHEAD": "false",
    },
    CLAIMS_AHEAD: {
        "TASKPLAT_WORKER_POLL_DISPATCHER": "false",
        "TASKPLAT_WORKER_CLAIM_AHEAD": "true",
    },
}


@dataclass(frozen=True)
class ChaosConfig:
    run_dir: Path
    tasks: int = 10_000
    fault_seconds: float = 90.0
    drain_seconds: float = 300.0
    rates: FaultRates = field(
        default_factory=lambda: FaultRates(
            lose=0.05, duplicate=0.05, fail_receive=0.05, fail_delete=0.05
        )
    )
    kill_every: float = 5.0  # mean seconds between two SIGKILLs (0: none)
    postgres_restarts: int = 2
    workers: int = 2
    replicas: int = 2  # processes of each of REPLICATED
    variant: str = WAITING_CLAIMS  # its VARIANT_ENV on the wrappers
    task_sleep: float = 0.005  # seconds each task's operator sleeps
    seed: int | None = None
    sqs_endpoint_url: str | None = None  # a running SQS endpoint to put the injector in front of
    limits: ChaosLimits = field(default_factory=ChaosLimits)  # set on the queue before the faults

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise DevstackError("chaos needs at least one task")
        if self.fault_seconds <= 0 or self.drain_seconds <= 0:
            raise DevstackError("the fault and drain windows must be positive")
        if self.workers < 1:
            raise DevstackError("chaos needs at least one worker wrapper")
        if self.replicas < 1:
            raise DevstackError("chaos needs at least one replica of each service")
        if self.variant not in VARIANTS:
            raise DevstackError(f"unknown chaos variant {self.variant!r}")

    @property
    def waiting_claims(self) -> bool:
        return self.variant == WAITING_CLAIMS


def variant_configs(config: ChaosConfig, variants: tuple[str, ...]) -> list[ChaosConfig]:
    """One config per variant, each in its own directory under `config.run_dir`, with the seed
    plus the variant's index in VARIANTS (so the variants draw different kill schedules, and a
    variant run alone replays the same one)."""
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown or not variants:
        raise DevstackError(f"unknown chaos variant {unknown}: choose from {', '.join(VARIANTS)}")
    seed = config.seed
    return [
        replace(
            config,
            run_dir=config.run_dir / name,
            variant=name,
            seed=None if seed is None else seed + VARIANTS.index(name),
        )
        for name in variants
    ]
