"""The dev API key and worker token of a local stack, and the shell-sourceable `stack.env`.

Invariants:
- `secrets.env` is created once per run directory with random values and mode 0600, and later
  starts reuse it, so a restarted stack keeps its API key and worker token. A file that does not
  hold both values is refused with a message (never silently replaced).
- Files are written to a temporary name with mode 0600 and renamed into place, so a reader never
  sees a half-written file nor a moment where the secrets are readable by others.
- Values are single-quoted for the shell (`shlex.quote`), so `source .run/stack.env` works.
"""

from __future__ import annotations

import os
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from taskplat.devstack.errors import DevstackError

API_KEY = "TASKPLAT_API_KEY"
WORKER_TOKEN = "TASKPLAT_WORKER_TOKEN"


@dataclass(frozen=True)
class StackSecrets:
    api_key: str
    worker_token: str


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically with mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DevstackError(f"cannot write {path}: {exc.strerror or exc}") from exc


def env_file_text(values: Mapping[str, str], header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"{name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a file written by `env_file_text` (comments, blank lines, `NAME=quoted`)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, raw = line.partition("=")
        parts = shlex.split(raw) if sep else []
        if not sep or len(parts) != 1:
            raise DevstackError(f"{path}:{number}: expected NAME=value")
        values[name.strip()] = parts[0]
    return values


def load_or_create_secrets(path: Path) -> StackSecrets:
    """The secrets kept in `path`, created with fresh random values when it does not exist."""
    if path.exists():
        try:
            values = read_env_file(path)
        except (OSError, ValueError) as exc:
            raise DevstackError(f"cannot read {path}: {exc}") from exc
        if not values.get(API_KEY) or not values.get(WORKER_TOKEN):
            raise DevstackError(
                f"{path} lacks {API_KEY} or {WORKER_TOKEN}: delete it to get new secrets"
            )
        return StackSecrets(api_key=values[API_KEY], worker_token=values[WORKER_TOKEN])
    created = StackSecrets(
        api_key=f"dev-{secrets.token_urlsafe(24)}", worker_token=secrets.token_urlsafe(32)
    )
    write_private(
        path,
        env_file_text(
            {API_KEY: created.api_key, WORKER_TOKEN: created.worker_token},
            "Secrets of this local Taskplat stack, generated on its first start. Keep private.",
        ),
    )
    return created
