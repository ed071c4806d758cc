"""Which event loop and HTTP parser uvicorn runs the dispatcher with.

Invariant: `auto` takes uvloop and httptools when they are importable and otherwise falls back to
asyncio and h11, saying so in the `dispatcher_server_impl` log line; asking explicitly for one
that is not installed is a settings error (exit 2), never a silent fallback.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from taskplat.common.errors import ConfigurationError
from taskplat.dispatcher.settings import DispatcherSettings


@dataclass(frozen=True)
class ServerImpl:
    loop: str  # uvicorn's `loop`: "uvloop" or "asyncio"
    http: str  # uvicorn's `http`: "httptools" or "h11"
    missing: tuple[str, ...]  # fast implementations `auto` had to do without


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _choose(wanted: str, fast: str, fallback: str, missing: list[str]) -> str:
    if wanted == "auto":
        if _installed(fast):
            return fast
        missing.append(fast)
        return fallback
    if wanted == fast and not _installed(fast):
        raise ConfigurationError(f"{fast} is not installed")
    return wanted


def choose_server_impl(settings: DispatcherSettings) -> ServerImpl:
    missing: list[str] = []
    loop = _choose(settings.event_loop, "uvloop", "asyncio", missing)
    http = _choose(settings.http_parser, "httptools", "h11", missing)
    return ServerImpl(loop, http, tuple(missing))
