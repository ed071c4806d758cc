"""structlog set-up, done once per process.

Invariants: JSON lines in production, console output for people; every line carries `service` and
whatever the caller bound through contextvars (`task_id`, `attempt`, `worker_id`). Values under keys
that name a secret are masked before rendering, so a token or password never reaches a log line.

Cost: a few lines per task are logged at INFO on the hot paths, so structlog's line is built by one
processor (`prepare_event`: context, level, timestamp, masking; the stack and exception renderers
only for a line that carries `stack_info` or `exc_info`) and rendered by one prepared JSON encoder;
the lines are the ones structlog's separate processors wrote, key for key. `info_lines` writes
many lines of one event (a bulk create's `task_created` per task) with the per-line work only:
the same lines, the context, level and timestamp taken once for them all, one write.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

import structlog

_SECRET_MARKERS = ("token", "password", "secret", "api_key", "apikey", "authorization")
_MASK = "***"


@functools.lru_cache(maxsize=1024)  # keys are a small fixed set: decide each once
def _is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS) and lowered != "lease_token"


def mask_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask values whose key names a secret (lease tokens are not secrets)."""
    for key in list(event_dict):
        if _is_secret_key(key):
            event_dict[key] = _MASK
    return event_dict


def _json_default(value: Any) -> Any:
    """What structlog's JSON renderer writes for a value JSON has no type for."""
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


# One encoder for every line (`json.dumps` with `default=` builds a new one per call).
_JSON = json.JSONEncoder(default=_json_default)
_STACK_INFO = structlog.processors.StackInfoRenderer()


def _render_json(event_dict: Any, **_kw: Any) -> str:
    return _JSON.encode(event_dict)


def _utc_timestamp() -> str:
    """Now, as the ISO UTC timestamp of a line."""
    return datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")


def _mask_secrets_in(fields: MutableMapping[str, Any]) -> None:
    """Mask, in place, the value of every field whose key names a secret."""
    for key in list(fields):
        if _is_secret_key(key):
            fields[key] = _MASK


def prepare_event(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the contextvars, the level, an ISO UTC timestamp, secrets masked,
    then the stack and the exception of a line that asks for them (in the order of structlog's
    own processors, in one call)."""
    event_dict = structlog.contextvars.merge_contextvars(logger, method_name, event_dict)
    event_dict = structlog.processors.add_log_level(logger, method_name, event_dict)
    event_dict["timestamp"] = _utc_timestamp()
    _mask_secrets_in(event_dict)
    if "stack_info" in event_dict:
        event_dict = _STACK_INFO(logger, method_name, event_dict)
    if "exc_info" in event_dict:
        event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
    return event_dict


def configure_logging(service: str, *, level: str = "INFO", fmt: str = "json") -> None:
    """Configure structlog and the stdlib root logger for this process."""
    numeric_level = logging.getLevelName(level.upper())
    if not isinstance(numeric_level, int):
        numeric_level = logging.INFO
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_render_json)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        mask_secrets,
    ]
    global _json_lines
    processors = [prepare_event, renderer]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
    # Route stdlib logging (uvicorn, psycopg, botocore) through the same renderer.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    _json_lines = (tuple(processors), numeric_level) if fmt != "console" else None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    for noisy in ("botocore", "boto3", "urllib3", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(numeric_level, logging.WARNING))


# The processors and level `configure_logging` set for JSON lines (None: console, or not set).
_json_lines: tuple[tuple[Any, ...], int] | None = None

_loggers: dict[str | None, Any] = {}
_loggers_made_for: tuple[Any, ...] = ()


def get_logger(name: str | None = None) -> Any:
    """A logger of the current structlog configuration, made once per name and configuration.

    `structlog.get_logger()` answers a lazy proxy that builds a new logger (and its output
    logger) on the first call of each proxy: about two thirds of the CPU of a log line for a
    caller that asks for a logger per line. A reconfiguration (`configure_logging`,
    `structlog.configure`, a test's `capture_logs`) or a new `sys.stdout` makes new ones.
    """
    global _loggers_made_for
    made_for = (*structlog.get_config().values(), sys.stdout)
    if len(made_for) != len(_loggers_made_for) or any(
        now is not then for now, then in zip(made_for, _loggers_made_for, strict=True)
    ):
        _loggers.clear()
        _loggers_made_for = made_for
    logger = _loggers.get(name)
    if logger is None:
        logger = _loggers[name] = structlog.get_logger(name).bind()
    return logger


def info_lines(event: str, lines: Iterable[Mapping[str, Any]]) -> None:
    """One INFO line of `event` per mapping of fields (`info_events` with one event)."""
    info_events((event, fields) for fields in lines)


def info_events(lines: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """One INFO line per (event, fields): the lines `get_logger().info(event, **fields)` writes
    for each, in order.

    Under `configure_logging`'s JSON lines the bound context, level and timestamp are taken once
    for all the lines (they are logged at one moment, so they share the timestamp) and the lines
    go out in one write; under any other configuration (console lines, a test's `capture_logs`)
    each line is logged on its own.
    """
    logger = get_logger()
    output = getattr(logger, "_logger", None)
    fast = _json_lines
    lines = list(lines)
    if (
        fast is None
        or tuple(structlog.get_config()["processors"]) != fast[0]  # capture_logs edits it
        or fast[1] > logging.INFO
        or not isinstance(output, structlog.PrintLogger)
        or any("stack_info" in fields or "exc_info" in fields for _, fields in lines)
    ):
        for event, fields in lines:
            logger.info(event, **fields)
        return
    # What `prepare_event` adds after the fields: the context not given (the bound logger of
    # `get_logger` carries none of its own), then the level and the timestamp, set over any field
    # of the same name.
    context = structlog.contextvars.get_contextvars()
    level = "info"
    timestamp = _utc_timestamp()
    rendered: list[str] = []
    for event, fields in lines:
        line = dict(fields)
        line["event"] = event
        for key, value in context.items():
            line.setdefault(key, value)
        line["level"] = level
        line["timestamp"] = timestamp
        _mask_secrets_in(line)
        rendered.append(_JSON.encode(line))
    if rendered:
        output.msg("\n".join(rendered))
