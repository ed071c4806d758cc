"""structlog set-up, done once per process.

Invariants: JSON lines in production, console output for people; every line carries `service` and
whatever the caller bound through contextvars (`task_id`, `attempt`, `worker_id`). Values under keys
that name a secret are masked before rendering, so a token or password never reaches a log line.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import MutableMapping
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


def configure_logging(service: str, *, level: str = "INFO", fmt: str = "json") -> None:
    """Configure structlog and the stdlib root logger for this process."""
    numeric_level = logging.getLevelName(level.upper())
    if not isinstance(numeric_level, int):
        numeric_level = logging.INFO
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        mask_secrets,
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
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
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    for noisy in ("botocore", "boto3", "urllib3", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(numeric_level, logging.WARNING))


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
