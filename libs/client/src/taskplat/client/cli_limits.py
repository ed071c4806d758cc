"""`taskplat queues limits`: show or replace a queue's limits (docs/queue-limits.md).

Invariants: the options given are the queue's new limits and every limit not given is removed
(the route replaces them all); `--rate` and `--burst` go together; `--clear` takes no limit
option; without options the command only reads.
"""

from __future__ import annotations

import click

from taskplat.client.cli_options import common, open_client
from taskplat.client.cli_output import OUT, emit
from taskplat.client.models import QueueView


def limits_text(queue: QueueView) -> str:
    """The queue's limits and their use, one line ("none" without limits)."""
    limits, use = queue.limits, queue.limits_use
    parts = []
    if limits.concurrency_limit is not None:
        parts.append(f"concurrency {use.running}/{limits.concurrency_limit}")
    if limits.key_concurrency_limit is not None:
        parts.append(f"per key {limits.key_concurrency_limit} ({use.keys_at_limit} at it)")
    if limits.rate_limit is not None:
        rate = limits.rate_limit
        parts.append(f"rate {rate.per_second:g}/s burst {rate.burst} ({use.tokens_left} left)")
    return ", ".join(parts) or "none"


@click.command(name="limits")
@click.argument("queue")
@click.option("--concurrency", type=click.IntRange(1), help="Tasks of QUEUE Running at once.")
@click.option("--key-concurrency", type=click.IntRange(1),
              help="Tasks Running at once per concurrency key.")  # fmt: skip
@click.option("--rate", type=click.FloatRange(0, min_open=True),
              help="Starts a second on average (with --burst).")  # fmt: skip
@click.option("--burst", type=click.IntRange(1), help="Starts allowed at once (with --rate).")
@click.option("--clear", is_flag=True, help="Remove every limit of QUEUE.")
@common
def queues_limits(
    queue: str,
    concurrency: int | None,
    key_concurrency: int | None,
    rate: float | None,
    burst: int | None,
    clear: bool,
) -> None:
    """Show QUEUE's limits and their use; with options, replace them (admin scope): the options
    given are the new limits, every limit not given is removed. --clear removes them all."""
    setting = any(value is not None for value in (concurrency, key_concurrency, rate, burst))
    if clear and setting:
        raise click.UsageError("--clear takes no limit options")
    if (rate is None) != (burst is None):
        raise click.UsageError("--rate and --burst go together")
    with open_client() as client:
        if clear:
            answer = client.clear_queue_limits(queue)
        elif setting:
            answer = client.set_queue_limits(
                queue,
                concurrency_limit=concurrency,
                key_concurrency_limit=key_concurrency,
                rate_per_second=rate,
                rate_burst=burst,
            )
        else:
            answer = client.queue(queue)
    emit(answer, lambda: OUT.print(f"{answer.name} limits: {limits_text(answer)}"))
