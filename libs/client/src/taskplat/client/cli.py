"""The `taskplat` command: the commands of docs/reference/clients.md over the sync client.

The options every command takes are `cli_options`', what commands print `cli_output`'s; the
operators' commands are in `cli_ops`.

Invariants: every command takes `--url`/`--api-key` (or TASKPLAT_URL/TASKPLAT_API_KEY) and
`--json`; human output goes to stdout as tables, progress and messages to stderr, so `--json`
output is exactly one JSON document on stdout; any error is one line on stderr
(`taskplat: <message>`) and exit status 1 (2 for a usage error). `submit --wait` and `watch` exit
3 when the task ends Dead or Canceled.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import yaml

from taskplat.client.cli_options import (
    STATUSES,
    TIMES,
    aware,
    common,
    json_arg,
    open_client,
)
from taskplat.client.cli_output import (
    ERR,
    OUT,
    emit,
    finish,
    follow,
    generic_table,
    rows_of,
    task_detail,
    tasks_table,
)
from taskplat.client.errors import TaskplatError
from taskplat.client.models import TaskView


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="taskplat-client", prog_name="taskplat")
@common
def main() -> None:
    """Taskplat from the command line: submit, inspect, cancel and replay tasks; apply DAGs.

    Settings: TASKPLAT_URL and TASKPLAT_API_KEY (or --url and --api-key). Human tables by default,
    --json for scripts. Errors: one line on stderr and a non-zero exit status.
    """


@main.command()
@click.argument("operator")
@click.option("--config", help="The task's config, a JSON object.")
@click.option("--inputs", help="The task's inputs, a JSON array.")
@click.option("--queue", "-q", help="The queue (default: the server's `default`).")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempt budget (1-100).")
@click.option("--timeout-seconds", type=click.IntRange(1), help="Hard deadline of an attempt.")
@click.option("--idempotency-key", help="Submitting the same key again returns the same task.")
@click.option("--priority", type=click.IntRange(0, 9), help="0-9, lower first (default 5).")
@click.option("--concurrency-key", help="A customer, store or account (1-200 printable "
              "characters): keys take turns; a queue may limit Running tasks per key.")  # fmt: skip
@click.option("--scheduled-for", type=click.DateTime(TIMES), help="Run no earlier than this "
              "time (ISO 8601; local time unless it names a zone).")  # fmt: skip
@click.option(
    "--expires-at",
    type=click.DateTime(TIMES),
    help="Cancel the task if it has not started by this time.",
)
@click.option("--wait", "wait_", is_flag=True, help="Wait for the task to finish (exit 3 unless "
              "it Completed), showing its progress on stderr.")  # fmt: skip
@click.option("--wait-timeout", type=float, help="Give up waiting after this many seconds.")
@common
def submit(
    operator: str,
    config: str | None,
    inputs: str | None,
    queue: str | None,
    max_attempts: int | None,
    timeout_seconds: int | None,
    idempotency_key: str | None,
    priority: int | None,
    concurrency_key: str | None,
    scheduled_for: datetime | None,
    expires_at: datetime | None,
    wait_: bool,
    wait_timeout: float | None,
) -> None:
    """Submit a task running OPERATOR."""
    fields = {
        "config": json_arg(config, "--config"),
        "inputs": json_arg(inputs, "--inputs"),
        "queue": queue,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout_seconds,
        "idempotency_key": idempotency_key,
        "priority": priority,
        "concurrency_key": concurrency_key,
        "scheduled_for": aware(scheduled_for),
        "expires_at": aware(expires_at),
    }
    with open_client() as client:
        task = client.submit(operator, **fields)
        if not wait_:
            emit(task, lambda: OUT.print(f"{task.task_id} {task.status}"))
            return
        ERR.print(f"submitted {task.task_id}")
        finish(follow(client, task.task_id, wait_timeout))


@main.command()
@click.argument("task_id")
@common
def get(task_id: str) -> None:
    """Show a task: its state, result, error and attempts."""
    with open_client() as client:
        task = client.get(task_id)
    emit(task, lambda: task_detail(task))


@main.command(name="list")
@click.option("--status", "-s", type=click.Choice(STATUSES), help="Only tasks in this state.")
@click.option("--queue", "-q", help="Only tasks of this queue.")
@click.option("--operator", "-o", help="Only tasks of this operator.")
@click.option("--dag", help="Only tasks of this DAG's jobs.")
@click.option("--job", help="Only tasks of this job (with --dag).")
@click.option("--since", type=click.DateTime(TIMES), help="Created at or after this time.")
@click.option("--until", type=click.DateTime(TIMES), help="Created before this time.")
@click.option("--limit", "-n", type=click.IntRange(1), default=50, show_default=True,
              help="At most this many tasks (pages are followed).")  # fmt: skip
@common
def list_(
    status: str | None,
    queue: str | None,
    operator: str | None,
    dag: str | None,
    job: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> None:
    """List tasks, newest first."""
    filters = {"dag": dag, "job": job, "since": aware(since), "until": aware(until)}
    _list_tasks(status, queue, operator, limit, **filters)


def _list_tasks(
    status: str | None, queue: str | None, operator: str | None, limit: int, **filters: Any
) -> None:
    with open_client() as client:
        tasks: list[TaskView] = []
        for task in client.iter_tasks(
            status=status, queue=queue, operator=operator, limit=min(limit, 500), **filters
        ):
            tasks.append(task)
            if len(tasks) >= limit:
                break
    emit({"tasks": [task.model_dump(mode="json") for task in tasks]},
          lambda: tasks_table(tasks))  # fmt: skip


@main.command()
@click.argument("task_id")
@common
def cancel(task_id: str) -> None:
    """Cancel a task that has not finished."""
    with open_client() as client:
        task = client.cancel(task_id)
    emit(task, lambda: OUT.print(f"{task.task_id} {task.status}"))


REPIN_HELP = (
    "Re-pin tasks pinned to a dataset version that is no longer current to the current versions "
    "(without it they are refused: PinnedVersionNotCurrent)."
)


@main.command()
@click.argument("task_id")
@click.option("--repin", is_flag=True, help=REPIN_HELP)
@common
def retry(task_id: str, repin: bool) -> None:
    """Replay a Dead or Canceled task as a new attempt with a fresh budget."""
    with open_client() as client:
        task = client.retry(task_id, repin=repin)
    emit(task, lambda: OUT.print(f"{task.task_id} {task.status} (attempt {task.attempt})"))


@main.command()
@click.argument("task_id")
@click.option("--timeout", type=float, help="Give up after this many seconds.")
@common
def watch(task_id: str, timeout: float | None) -> None:
    """Follow a task until it finishes (exit 3 unless it Completed)."""
    with open_client() as client:
        finish(follow(client, task_id, timeout))


@main.group()
@common
def dead() -> None:
    """Dead tasks: list and replay."""


@dead.command(name="list")
@click.option("--queue", "-q", help="Only tasks of this queue.")
@click.option("--operator", "-o", help="Only tasks of this operator.")
@click.option("--limit", "-n", type=click.IntRange(1), default=50, show_default=True)
@common
def dead_list(queue: str | None, operator: str | None, limit: int) -> None:
    """List Dead tasks, newest first."""
    _list_tasks("Dead", queue, operator, limit)


@dead.command(name="replay")
@click.argument("task_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Replay every Dead task matching the filter.")
@click.option("--queue", "-q", help="Only Dead tasks of this queue.")
@click.option("--operator", "-o", help="Only Dead tasks of this operator.")
@click.option("--dag", help="Only Dead tasks of this DAG.")
@click.option("--job", help="Only Dead tasks of this job.")
@click.option("--limit", "-n", type=click.IntRange(1), help="Replay at most this many.")
@click.option("--repin", is_flag=True, help=REPIN_HELP)
@common
def dead_replay(
    task_ids: tuple[str, ...],
    all_: bool,
    queue: str | None,
    operator: str | None,
    dag: str | None,
    job: str | None,
    limit: int | None,
    repin: bool,
) -> None:
    """Replay Dead tasks: the IDs given, or with --all (or a filter) every matching one."""
    filters: dict[str, Any] = {"queue": queue, "operator": operator, "dag": dag, "job": job}
    filtered = any(value is not None for value in filters.values())
    repinning = True if repin else None  # sent only when asked for
    if task_ids and (all_ or filtered or limit):
        raise click.UsageError("give task IDs or --all/a filter, not both")
    if not task_ids and not (all_ or filtered):
        raise click.UsageError("give task IDs, --all, or a filter (--queue, --operator, ...)")
    replayed: list[str] = []
    skipped: list[dict[str, Any]] = []
    with open_client() as client:
        if task_ids:
            answer = client.retry_many(list(task_ids), repin=repinning)
            replayed = [str(task_id) for task_id in answer.replayed]
            skipped = [item.model_dump(mode="json") for item in answer.skipped]
        else:
            while limit is None or len(replayed) < limit:
                batch = 1000 if limit is None else min(1000, limit - len(replayed))
                answer = client.retry_many(status="Dead", limit=batch, repin=repinning, **filters)
                replayed += [str(task_id) for task_id in answer.replayed]
                if len(answer.replayed) < batch:
                    break

    def human() -> None:
        OUT.print(f"replayed {len(replayed)} task(s)")
        for task_id in replayed:
            OUT.print(f"  {task_id}")
        for item in skipped:
            OUT.print(f"skipped {item['task_id']}: {item['reason']}")

    emit({"replayed": replayed, "skipped": skipped}, human)
    if skipped:
        sys.exit(1)


@main.group()
@common
def dags() -> None:
    """DAGs: apply a document, list, get, delete."""


@dags.command(name="apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="The DAG's name (default: the document's `name`, else the file's).")
@common
def dags_apply(file: Path, name: str | None) -> None:
    """Apply a DAG document (YAML or JSON) whole: PUT /dags/{name}."""
    try:
        document = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        message = f"not YAML or JSON: {exc}".splitlines()[0]
        raise click.BadParameter(message, param_hint="FILE") from None
    if not isinstance(document, dict):
        raise click.BadParameter("the document must be a mapping with `jobs`", param_hint="FILE")
    dag_name = name or document.pop("name", None) or file.stem
    with open_client() as client:
        answer = client.apply_dag(str(dag_name), document)
    emit(answer, lambda: OUT.print(f"applied DAG {dag_name}"))


@dags.command(name="list")
@common
def dags_list() -> None:
    """List the DAGs."""
    with open_client() as client:
        answer = client.dags()
    rows = rows_of(answer, "dags")
    emit(answer, lambda: generic_table(rows, ["dag_name", "jobs", "updated_at"]))


@main.group()
@common
def datasets() -> None:
    """Datasets: list, get, versions, events, roll one back."""


@datasets.command(name="list")
@common
def datasets_list() -> None:
    """List the datasets with their current version."""
    with open_client() as client:
        answer = client.datasets()
    rows = rows_of(answer, "datasets")
    columns = ["dataset_uuid", "name", "kind", "current_version"]
    emit(answer, lambda: generic_table(rows, columns))


@datasets.command(name="rollback")
@click.argument("dataset_uuid")
@click.argument("dataset_version")
@common
def datasets_rollback(dataset_uuid: str, dataset_version: str) -> None:
    """Make an earlier version of a dataset current again (live tasks pinned to the version it
    replaces are canceled)."""
    with open_client() as client:
        answer = client.rollback_dataset(dataset_uuid, dataset_version)
    emit(
        answer,
        lambda: OUT.print(
            f"{answer.dataset.dataset_uuid} current version {answer.dataset.current_version} "
            f"({answer.canceled_tasks} tasks canceled)"
        ),
    )


def _fields_named(exc: TaskplatError) -> str:
    """`(field: problem; ...)` of a 422's detail, so the line says what to fix."""
    detail = getattr(exc, "detail", None)
    if not isinstance(detail, list):
        return ""
    named = [
        f"{'.'.join(str(part) for part in error.get('loc', [])[1:])}: {error.get('msg', '')}"
        for error in detail[:3]
        if isinstance(error, dict)
    ]
    return f" ({'; '.join(named)})" if named else ""


def run(argv: list[str] | None = None) -> int:
    """Run the command; the exit status (errors as one line on stderr)."""
    try:
        main.main(args=argv, prog_name="taskplat", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.Abort:
        click.echo("taskplat: aborted", err=True)
        return 1
    except click.ClickException as exc:
        click.echo(f"taskplat: {exc.format_message()}", err=True)
        return exc.exit_code
    except TaskplatError as exc:
        click.echo(f"taskplat: {exc}".splitlines()[0] + _fields_named(exc), err=True)
        return 1
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def cli() -> None:
    sys.exit(run())


# The operators' commands (queues, workers, stats, runs, keys, audit, ...) add themselves to `main`
# and its groups; imported last, when every name they use is defined.
from taskplat.client import cli_ops  # noqa: E402, F401
