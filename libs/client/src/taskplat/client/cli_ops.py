"""The `taskplat` commands of operating the platform: queues, workers, figures, job runs, DAG
and dataset details, API keys, the audit log and shell completion.

Invariants: the same rules as `cli` (its `common` options, `--json` for exactly one JSON document
on stdout, errors one line on stderr); a new key's secret is printed once, on stdout, and never
again by any command; list commands follow the API's pages up to `--limit`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from click.shell_completion import get_completion_class
from rich.table import Table

from taskplat.client.cli import dags, datasets, main
from taskplat.client.cli_limits import limits_text, queues_limits
from taskplat.client.cli_options import TIMES, aware, common, json_arg, open_client
from taskplat.client.cli_output import ERR, OUT, emit, finish, follow, generic_table, when
from taskplat.client.models import AuditEntry, QueueView

SCOPES = ["read", "submit", "operate", "admin"]
SHELLS = ["bash", "zsh", "fish"]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---- queues ------------------------------------------------------------------------------


@main.group()
@common
def queues() -> None:
    """Queues: list, pause, resume, register, limits."""


def _queue_line(queue: QueueView, verb: str) -> None:
    OUT.print(f"{queue.name} {verb} (depth {queue.depth}, running {queue.running})")


queues.add_command(queues_limits)


@queues.command(name="list")
@common
def queues_list() -> None:
    """List the registered queues: depth, running, oldest Queued age, paused, and SQS (missing:
    the relay holds the queue, its SQS queue does not exist)."""
    with open_client() as client:
        answer = client.queues()

    def human() -> None:
        table = Table(box=None, header_style="bold")
        for column in ("QUEUE", "STATE", "SQS", "DEPTH", "RUNNING", "OLDEST QUEUED", "LIMITS"):
            table.add_column(column)
        for q in answer.queues:
            table.add_row(q.name, "paused" if q.paused else "running", q.sqs.state,
                          str(q.depth), str(q.running),
                          _age(q.oldest_queued_age_seconds), limits_text(q))  # fmt: skip
        OUT.print(table)

    emit(answer, human)


@queues.command(name="pause")
@click.argument("queue")
@common
def queues_pause(queue: str) -> None:
    """Pause QUEUE: its tasks stay Queued and are not handed out."""
    with open_client() as client:
        answer = client.pause(queue)
    emit(answer, lambda: _queue_line(answer, "paused"))


@queues.command(name="resume")
@click.argument("queue")
@common
def queues_resume(queue: str) -> None:
    """Resume a paused QUEUE."""
    with open_client() as client:
        answer = client.resume(queue)
    emit(answer, lambda: _queue_line(answer, "running"))


@queues.command(name="register")
@click.argument("queue")
@common
def queues_register(queue: str) -> None:
    """Register QUEUE so tasks may name it (admin scope)."""
    with open_client() as client:
        answer = client.register_queue(queue)
    emit(answer, lambda: _queue_line(answer, "registered"))


# ---- workers and figures -----------------------------------------------------------------


@main.command()
@common
def workers() -> None:
    """List the workers seen lately: state, queues, slots, running tasks, last seen."""
    with open_client() as client:
        answer = client.workers()

    def human() -> None:
        table = Table(box=None, header_style="bold")
        for column in ("WORKER", "STATE", "QUEUES", "SLOTS", "RUNNING", "VERSION", "LAST SEEN"):
            table.add_column(column, no_wrap=True)
        for w in answer.workers:
            table.add_row(w.worker_id, w.state, ",".join(w.queues), str(w.slots),
                          str(len(w.running)), w.version,
                          f"{_age(w.seconds_since_seen)} ago")  # fmt: skip
        OUT.print(table)
        if not answer.workers:
            ERR.print("no worker has reported lately")

    emit(answer, human)


@main.command()
@common
def stats() -> None:
    """Tasks by queue and state, and tasks finished in the last hour."""
    with open_client() as client:
        answer = client.stats()

    def human() -> None:
        rows = [c.model_dump(mode="json") for c in answer.counts]
        generic_table(rows, ["queue", "status", "tasks"])
        completed = sum(b.completed for b in answer.throughput)
        dead = sum(b.dead for b in answer.throughput)
        OUT.print(f"last hour: {completed} completed, {dead} dead")

    emit(answer, human)


# ---- job runs, DAGs and datasets -----------------------------------------------------------


@main.group()
@common
def runs() -> None:
    """Job runs: start one by hand."""


@runs.command(name="start")
@click.argument("dag")
@click.argument("job")
@click.option("--config", help="The run's config, a JSON object.")
@click.option("--inputs", help="The run's inputs, a JSON array.")
@click.option("--idempotency-key", help="Starting with the same key again returns the same task.")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the run's task to finish.")
@common
def runs_start(
    dag: str,
    job: str,
    config: str | None,
    inputs: str | None,
    idempotency_key: str | None,
    wait_: bool,
) -> None:
    """Start one run of JOB of DAG."""
    with open_client() as client:
        task = client.run_job(
            dag,
            job,
            config=json_arg(config, "--config"),
            inputs=json_arg(inputs, "--inputs"),
            idempotency_key=idempotency_key,
        )
        if not wait_:
            emit(task, lambda: OUT.print(f"{task.task_id} {task.status}"))
            return
        ERR.print(f"started {task.task_id}")
        finish(follow(client, task.task_id, None))


@dags.command(name="get")
@click.argument("name")
@common
def dags_get(name: str) -> None:
    """Show a DAG: its jobs with their operators, queues, inputs and outputs."""
    with open_client() as client:
        answer = client.dag(name)

    def human() -> None:
        rows = [job.model_dump(mode="json") for job in answer.jobs]
        generic_table(rows, ["name", "operator", "queue", "schedule", "inputs", "outputs"])

    emit(answer, human)


@dags.command(name="delete")
@click.argument("name")
@common
def dags_delete(name: str) -> None:
    """Delete a DAG: its routing and schedules stop; tasks and datasets stay."""
    with open_client() as client:
        answer = client.delete_dag(name)
    emit(answer, lambda: OUT.print(f"deleted DAG {answer.dag_name}"))


@datasets.command(name="get")
@click.argument("dataset_uuid")
@common
def datasets_get(dataset_uuid: str) -> None:
    """Show a dataset: kind, location, current version, latest cursor."""
    with open_client() as client:
        answer = client.dataset(dataset_uuid)

    def human() -> None:
        table = Table(box=None, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key in ("dataset_uuid", "name", "kind", "location", "current_version",
                    "latest_cursor", "row_count"):  # fmt: skip
            value = getattr(answer, key)
            if value is not None:
                table.add_row(key, str(value))
        OUT.print(table)

    emit(answer, human)


@datasets.command(name="versions")
@click.argument("dataset_uuid")
@click.option("--new", "new", is_flag=True, help="Make a new current version first (operate).")
@common
def datasets_versions(dataset_uuid: str, new: bool) -> None:
    """List a dataset's versions (with --new, make a new current version first)."""
    with open_client() as client:
        if new:
            made = client.new_dataset_version(dataset_uuid)
            ERR.print(f"new version {made.dataset.current_version}; "
                      f"{made.canceled_tasks} pinned task(s) canceled")  # fmt: skip
            answer = made.dataset
        else:
            answer = client.dataset(dataset_uuid)
    rows = [v.model_dump(mode="json") for v in answer.versions]
    emit({"versions": rows},
          lambda: generic_table(rows, ["dataset_version", "current", "created_at",
                                        "superseded_at"]))  # fmt: skip


@datasets.command(name="events")
@click.argument("dataset_uuid")
@click.option("--version", "dataset_version", help="Only events of this dataset version.")
@click.option("--limit", "-n", type=click.IntRange(1), default=50, show_default=True)
@common
def datasets_events(dataset_uuid: str, dataset_version: str | None, limit: int) -> None:
    """List a dataset's events, newest first, with their routing."""
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    with open_client() as client:
        while len(events) < limit:
            page = client.dataset_events(
                dataset_uuid, dataset_version=dataset_version, cursor=cursor
            )
            events += [e.model_dump(mode="json") for e in page.events]
            cursor = page.next_cursor
            if cursor is None:
                break
    events = events[:limit]
    columns = ["event_id", "dataset_version", "cursor", "partition_key", "routed", "created_at"]
    emit({"events": events}, lambda: generic_table(events, columns))


# ---- keys and the audit log ----------------------------------------------------------------


@main.group()
@common
def keys() -> None:
    """API keys: create (the secret is shown once), list, revoke (admin scope)."""


@keys.command(name="create")
@click.argument("name")
@click.option("--scope", "scopes", type=click.Choice(SCOPES), multiple=True, required=True,
              help="A scope of the key (repeat for several; admin holds them all).")  # fmt: skip
@common
def keys_create(name: str, scopes: tuple[str, ...]) -> None:
    """Create an API key NAME; its secret is printed once: store it now."""
    with open_client() as client:
        answer = client.create_key(name, list(scopes))

    def human() -> None:
        OUT.print(answer.key)
        ERR.print(f"key {answer.name} ({', '.join(answer.scopes)}): the secret above is not "
                  "shown again")  # fmt: skip

    emit(answer, human)


@keys.command(name="list")
@common
def keys_list() -> None:
    """List the stored API keys (names and scopes; never a secret)."""
    with open_client() as client:
        answer = client.keys()
    rows = [{**k.model_dump(mode="json"), "scopes": ",".join(k.scopes)} for k in answer.keys]
    emit(answer, lambda: generic_table(rows, ["name", "scopes", "created_at", "created_by"]))


@keys.command(name="revoke")
@click.argument("name")
@common
def keys_revoke(name: str) -> None:
    """Revoke the API key NAME (refused everywhere within the dispatcher's key cache time)."""
    with open_client() as client:
        answer = client.revoke_key(name)
    emit(answer, lambda: OUT.print(f"revoked key {answer.name}"))


@main.command()
@click.option("--since", type=click.DateTime(TIMES), help="Entries at or after this time.")
@click.option("--until", type=click.DateTime(TIMES), help="Entries before this time.")
@click.option("--key", help="Only calls made with this key (its name).")
@click.option("--action", help="Only this action (a route name: cancel_task, pause_queue, ...).")
@click.option("--target", help="Only calls on this target (task id, queue, DAG, key...).")
@click.option("--limit", "-n", type=click.IntRange(1), default=50, show_default=True)
@common
def audit(
    since: datetime | None,
    until: datetime | None,
    key: str | None,
    action: str | None,
    target: str | None,
    limit: int,
) -> None:
    """The audit log of operate and admin calls and their refusals, newest first (an admin key)."""
    entries: list[AuditEntry] = []
    cursor: str | None = None
    filters = {"since": aware(since), "until": aware(until), "key": key, "action": action,
               "target": target}  # fmt: skip
    with open_client() as client:
        while len(entries) < limit:
            page = client.audit(**filters, cursor=cursor, limit=min(500, limit - len(entries)))
            entries += page.entries
            cursor = page.next_cursor
            if cursor is None:
                break

    def human() -> None:
        table = Table(box=None, header_style="bold")
        for column in ("WHEN", "KEY", "ACTION", "TARGET", "OUTCOME"):
            table.add_column(column, no_wrap=column != "OUTCOME")
        for e in entries:
            table.add_row(when(e.at), e.key_name, e.action, e.target or "", e.outcome)
        OUT.print(table)

    emit({"entries": [e.model_dump(mode="json") for e in entries]}, human)


# ---- shell completion ----------------------------------------------------------------------


@main.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script of SHELL.

    \b
    bash: eval "$(taskplat completion bash)"   (e.g. in ~/.bashrc)
    zsh:  eval "$(taskplat completion zsh)"    (e.g. in ~/.zshrc)
    fish: taskplat completion fish > ~/.config/fish/completions/taskplat.fish
    """
    completer = get_completion_class(shell)
    assert completer is not None  # every SHELLS entry is one of click's
    click.echo(completer(main, {}, "taskplat", "_TASKPLAT_COMPLETE").source())
