"""The `taskplat` command: the commands of the README's "Using Taskplat" over the sync client.

Invariants: every command takes `--url`/`--api-key` (or TASKPLAT_URL/TASKPLAT_API_KEY) and
`--json`; human output goes to stdout as tables, progress and messages to stderr, so `--json`
output is exactly one JSON document on stdout; any error is one line on stderr
(`taskplat: <message>`) and exit status 1 (2 for a usage error). `submit --wait` and `watch` exit
3 when the task ends Dead or Canceled.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import click
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from taskplat.client.errors import TaskplatError
from taskplat.client.models import TaskView
from taskplat.client.sync import Client

F = TypeVar("F", bound=Callable[..., Any])
# Times the options take: ISO 8601, with or without seconds and a zone (naive: local time).
TIMES = ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S",
         "%Y-%m-%d"]  # fmt: skip
STATUSES = ["Scheduled", "Queued", "Running", "Completed", "Failed", "Dead", "Canceled"]
NOT_COMPLETED_EXIT = 3


@dataclass
class Settings:
    url: str | None = None
    api_key: str | None = None
    json: bool = False


def _store(field: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        settings = ctx.find_object(Settings) or ctx.ensure_object(Settings)
        if value not in (None, False):
            setattr(settings, field, value)
        return value

    return callback


def common(command: F) -> F:
    """--url, --api-key and --json, accepted before or after the command name."""
    for option in (
        click.option("--json", "as_json", is_flag=True, expose_value=False,
                     callback=_store("json"), help="Print JSON for scripts."),
        click.option("--api-key", envvar="TASKPLAT_API_KEY", expose_value=False,
                     callback=_store("api_key"), help="API key [env TASKPLAT_API_KEY]."),
        click.option("--url", envvar="TASKPLAT_URL", expose_value=False, callback=_store("url"),
                     help="Dispatcher URL [env TASKPLAT_URL; default http://127.0.0.1:8080]."),
    ):  # fmt: skip
        command = option(command)
    return command


def _settings() -> Settings:
    return click.get_current_context().ensure_object(Settings)


@contextmanager
def _client() -> Iterator[Client]:
    settings = _settings()
    with Client(settings.url, settings.api_key) as client:
        yield client


OUT = Console(highlight=False, soft_wrap=True)
ERR = Console(stderr=True, highlight=False)


def _emit(value: Any, human: Callable[[], None]) -> None:
    if _settings().json:
        if isinstance(value, BaseModel):
            click.echo(value.model_dump_json(indent=2, by_alias=True))
        else:
            click.echo(json.dumps(value, indent=2, default=str))
    else:
        human()


def aware(value: datetime | None) -> datetime | None:
    """A time option as an aware datetime (a naive one is local time)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone()


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg}", param_hint=what) from None


def _when(value: Any) -> str:
    return "" if value is None else str(value.isoformat(timespec="seconds"))


def _tasks_table(tasks: list[TaskView], title: str | None = None) -> None:
    table = Table(title=title, box=None, header_style="bold")
    for column in ("TASK", "STATUS", "ATTEMPT", "QUEUE", "OPERATOR", "CREATED", "LAST ERROR"):
        table.add_column(column, no_wrap=column != "LAST ERROR")
    for task in tasks:
        error = (task.last_error or "").splitlines()[0][:60] if task.last_error else ""
        table.add_row(str(task.task_id), task.status, f"{task.attempt}/{task.max_attempts}",
                      task.queue, task.operator, _when(task.created_at), error)  # fmt: skip
    OUT.print(table)


def _task_detail(task: TaskView) -> None:
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    job = f"{task.job.dag_name}/{task.job.name}" if task.job else ""
    rows = [("task_id", str(task.task_id)), ("status", task.status),
            ("attempt", f"{task.attempt} of {task.max_attempts}"), ("queue", task.queue),
            ("operator", task.operator), ("job", job), ("created_at", _when(task.created_at)),
            ("started_at", _when(task.started_at)), ("finished_at", _when(task.finished_at)),
            ("next_retry_at", _when(task.next_retry_at)), ("worker_id", task.worker_id or ""),
            ("dead_reason", task.dead_reason or ""), ("last_error", task.last_error or ""),
            ("config", json.dumps(task.config)),
            ("result", "" if task.result is None else json.dumps(task.result))]  # fmt: skip
    for key, value in rows:
        if value:
            table.add_row(key, value)
    OUT.print(table)
    if task.attempts:
        attempts = Table(title="attempts", box=None, header_style="bold")
        for column in ("#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"):
            attempts.add_column(column)
        for a in task.attempts:
            attempts.add_row(str(a.attempt), a.worker_id, _when(a.started_at),
                             _when(a.finished_at), a.outcome or "running",
                             (a.error or "").splitlines()[0][:60] if a.error else "")  # fmt: skip
        OUT.print(attempts)


def _follow(client: Client, task_id: str | UUID, timeout: float | None) -> TaskView:
    """Poll the task, showing its state on stderr; exit 3 unless it Completed."""
    with ERR.status(f"task {task_id}: waiting") as status:

        def update(task: TaskView) -> None:
            status.update(f"task {task_id}: {task.status} (attempt {task.attempt})")

        task = client.wait(task_id, timeout=timeout, on_update=update)
    return task


def _finish(task: TaskView) -> None:
    _emit(task, lambda: _task_detail(task))
    if task.status != "Completed":
        sys.exit(NOT_COMPLETED_EXIT)


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
    scheduled_for: datetime | None,
    expires_at: datetime | None,
    wait_: bool,
    wait_timeout: float | None,
) -> None:
    """Submit a task running OPERATOR."""
    fields = {
        "config": _json_arg(config, "--config"),
        "inputs": _json_arg(inputs, "--inputs"),
        "queue": queue,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout_seconds,
        "idempotency_key": idempotency_key,
        "scheduled_for": aware(scheduled_for),
        "expires_at": aware(expires_at),
    }
    with _client() as client:
        task = client.submit(operator, **fields)
        if not wait_:
            _emit(task, lambda: OUT.print(f"{task.task_id} {task.status}"))
            return
        ERR.print(f"submitted {task.task_id}")
        _finish(_follow(client, task.task_id, wait_timeout))


@main.command()
@click.argument("task_id")
@common
def get(task_id: str) -> None:
    """Show a task: its state, result, error and attempts."""
    with _client() as client:
        task = client.get(task_id)
    _emit(task, lambda: _task_detail(task))


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
    with _client() as client:
        tasks: list[TaskView] = []
        for task in client.iter_tasks(
            status=status, queue=queue, operator=operator, limit=min(limit, 500), **filters
        ):
            tasks.append(task)
            if len(tasks) >= limit:
                break
    _emit({"tasks": [task.model_dump(mode="json") for task in tasks]},
          lambda: _tasks_table(tasks))  # fmt: skip


@main.command()
@click.argument("task_id")
@common
def cancel(task_id: str) -> None:
    """Cancel a task that has not finished."""
    with _client() as client:
        task = client.cancel(task_id)
    _emit(task, lambda: OUT.print(f"{task.task_id} {task.status}"))


@main.command()
@click.argument("task_id")
@common
def retry(task_id: str) -> None:
    """Replay a Dead or Canceled task as a new attempt with a fresh budget."""
    with _client() as client:
        task = client.retry(task_id)
    _emit(task, lambda: OUT.print(f"{task.task_id} {task.status} (attempt {task.attempt})"))


@main.command()
@click.argument("task_id")
@click.option("--timeout", type=float, help="Give up after this many seconds.")
@common
def watch(task_id: str, timeout: float | None) -> None:
    """Follow a task until it finishes (exit 3 unless it Completed)."""
    with _client() as client:
        _finish(_follow(client, task_id, timeout))


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
@common
def dead_replay(
    task_ids: tuple[str, ...],
    all_: bool,
    queue: str | None,
    operator: str | None,
    dag: str | None,
    job: str | None,
    limit: int | None,
) -> None:
    """Replay Dead tasks: the IDs given, or with --all (or a filter) every matching one."""
    filters: dict[str, Any] = {"queue": queue, "operator": operator, "dag": dag, "job": job}
    filtered = any(value is not None for value in filters.values())
    if task_ids and (all_ or filtered or limit):
        raise click.UsageError("give task IDs or --all/a filter, not both")
    if not task_ids and not (all_ or filtered):
        raise click.UsageError("give task IDs, --all, or a filter (--queue, --operator, ...)")
    replayed: list[str] = []
    skipped: list[dict[str, Any]] = []
    with _client() as client:
        if task_ids:
            answer = client.retry_many(list(task_ids))
            replayed = [str(task_id) for task_id in answer.replayed]
            skipped = [item.model_dump(mode="json") for item in answer.skipped]
        else:
            while limit is None or len(replayed) < limit:
                batch = 1000 if limit is None else min(1000, limit - len(replayed))
                answer = client.retry_many(status="Dead", limit=batch, **filters)
                replayed += [str(task_id) for task_id in answer.replayed]
                if len(answer.replayed) < batch:
                    break

    def human() -> None:
        OUT.print(f"replayed {len(replayed)} task(s)")
        for task_id in replayed:
            OUT.print(f"  {task_id}")
        for item in skipped:
            OUT.print(f"skipped {item['task_id']}: {item['reason']}")

    _emit({"replayed": replayed, "skipped": skipped}, human)
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
    with _client() as client:
        answer = client.apply_dag(str(dag_name), document)
    _emit(answer, lambda: OUT.print(f"applied DAG {dag_name}"))


def _rows_of(answer: BaseModel, key: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = answer.model_dump(mode="json")[key]
    return rows


def _generic_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(box=None, header_style="bold")
    for column in columns:
        table.add_column(column.upper())
    for row in rows:
        table.add_row(*[_cell(row.get(column)) for column in columns])
    OUT.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return str(len(value))
    return str(value)


@dags.command(name="list")
@common
def dags_list() -> None:
    """List the DAGs."""
    with _client() as client:
        answer = client.dags()
    rows = _rows_of(answer, "dags")
    _emit(answer, lambda: _generic_table(rows, ["dag_name", "jobs", "updated_at"]))


@main.group()
@common
def datasets() -> None:
    """Datasets: list, get, versions, events, roll one back."""


@datasets.command(name="list")
@common
def datasets_list() -> None:
    """List the datasets with their current version."""
    with _client() as client:
        answer = client.datasets()
    rows = _rows_of(answer, "datasets")
    columns = ["dataset_uuid", "name", "kind", "current_version"]
    _emit(answer, lambda: _generic_table(rows, columns))


@datasets.command(name="rollback")
@click.argument("dataset_uuid")
@click.argument("dataset_version")
@common
def datasets_rollback(dataset_uuid: str, dataset_version: str) -> None:
    """Make an earlier version of a dataset current again (live tasks pinned to the version it
    replaces are canceled)."""
    with _client() as client:
        answer = client.rollback_dataset(dataset_uuid, dataset_version)
    _emit(
        answer,
        lambda: OUT.print(
            f"{answer.dataset.dataset_uuid} current version {answer.dataset.current_version} "
            f"({answer.canceled_tasks} tasks canceled)"
        ),
    )


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
        click.echo(f"taskplat: {exc}".splitlines()[0], err=True)
        return 1
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def cli() -> None:
    sys.exit(run())


# The operators' commands (queues, workers, stats, runs, keys, audit, ...) add themselves to `main`
# and its groups; imported last, when every name they use is defined.
from taskplat.client import cli_ops  # noqa: E402, F401
