"""The options every `taskplat` command takes, and reading the others' values.

Invariants: every command takes `--url`/`--api-key` (or TASKPLAT_URL/TASKPLAT_API_KEY) and `--json`
(`common`), before or after its name; a time option is ISO 8601 and a naive one local time
(`aware`); a JSON option that is not JSON is a usage error naming the option (`json_arg`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import click

from taskplat.client.sync import Client

F = TypeVar("F", bound=Callable[..., Any])
# Times the options take: ISO 8601, with or without seconds and a zone (naive: local time).
TIMES = ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S",
         "%Y-%m-%d"]  # fmt: skip
STATUSES = ["Scheduled", "Queued", "Running", "Completed", "Failed", "Dead", "Canceled"]


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


def cli_settings() -> Settings:
    return click.get_current_context().ensure_object(Settings)


@contextmanager
def open_client() -> Iterator[Client]:
    settings = cli_settings()
    with Client(settings.url, settings.api_key) as client:
        yield client


def aware(value: datetime | None) -> datetime | None:
    """A time option as an aware datetime (a naive one is local time)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone()


def json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg}", param_hint=what) from None
