"""A local AWS endpoint: LocalStack (SQS, and STS, S3 and IAM for the credential broker) in its own
venv, or moto's server (which serves all of them too) as a fallback.

Invariants:
- The server listens on 127.0.0.1:<port> only; the endpoint URL is ``http://127.0.0.1:<port>``
  and the queue URLs it hands out point at that same address.
- ``start()`` returns only once an SQS ``ListQueues`` call succeeds. If LocalStack cannot be
  installed or started, it logs a warning and starts moto instead; ``kind`` says which one runs,
  ``fallback_reason`` why moto stands in, and ``fallbacks()`` lists every such fallback of this
  process (the pytest plugin prints them in the run's summary).
- The server leads its own process group; ``stop()`` ends the whole group (SIGTERM, then SIGKILL
  after a deadline) and is idempotent. State lives only under ``base_dir``.
- ``sqs_client`` never reads ~/.aws nor any credential provider (so it never asks the EC2
  metadata service): it uses the dummy credentials ``test``/``test``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import boto3
import botocore.session
from botocore.config import Config

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.procs import Child, spawn, wait_until
from taskplat.devstack.venvs import ensure_localstack_venv, ensure_moto_venv

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

__all__ = ["LocalSqs", "SqsKind", "ensure_localstack_venv", "fallbacks", "sqs_client"]

log = logging.getLogger(__name__)

SqsKind = Literal["localstack", "moto"]
_PROBE_CONFIG = Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
_FALLBACKS: list[str] = []


def fallbacks() -> list[str]:
    """Why LocalStack could not start, once per moto server started in its place by this process."""
    return list(_FALLBACKS)


def sqs_client(
    endpoint_url: str, region: str = "us-east-1", *, config: Config | None = None
) -> SQSClient:
    """A boto3 SQS client for ``endpoint_url`` with dummy credentials and no AWS config files."""
    # No profile, whatever AWS_PROFILE says (a missing profile would make botocore raise), and
    # /dev/null for both AWS files.
    core = botocore.session.Session(session_vars={"profile": (None, None, None, None)})
    core.set_config_variable("config_file", os.devnull)
    core.set_config_variable("credentials_file", os.devnull)
    session = boto3.session.Session(
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name=region,
        botocore_session=core,
    )
    return session.client("sqs", endpoint_url=endpoint_url, config=config)


def _server_env(home: Path) -> dict[str, str]:
    """A small, explicit environment: nothing of the caller's AWS or LocalStack settings leaks
    into the server, and it keeps its files under ``home``."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    return env


class LocalSqs:
    """An SQS endpoint of its own in ``base_dir``, for one developer or one test session."""

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        die_with_parent: bool = False,
        start_timeout: float = 60.0,
        localstack_venv: Path | None = None,
        uv: str | None = None,
        server: SqsKind | None = None,
    ) -> None:
        """``server`` forces one kind (default: ``$TASKPLAT_SQS_SERVER``, else LocalStack with
        the moto fallback); ``localstack_venv`` and ``uv`` go to ``ensure_localstack_venv``."""
        self.base_dir = Path(base_dir).absolute()
        self.log_path = Path(log_path).absolute() if log_path else self.base_dir / "sqs.log"
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self.localstack_venv = localstack_venv
        self.uv = uv
        wanted = server or os.environ.get("TASKPLAT_SQS_SERVER") or "localstack"
        if wanted not in ("localstack", "moto"):
            raise DevstackError(f"unknown SQS server {wanted!r}: use 'localstack' or 'moto'")
        self._wanted: SqsKind = "moto" if wanted == "moto" else "localstack"
        self._requested_port = port
        self._port: int | None = None
        self._kind: SqsKind | None = None
        self._child: Child | None = None
        self.fallback_reason: str | None = None

    @property
    def endpoint_url(self) -> str:
        if self._port is None:
            raise DevstackError("LocalSqs has not been started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def kind(self) -> SqsKind:
        if self._kind is None:
            raise DevstackError("LocalSqs has not been started")
        return self._kind

    @property
    def pid(self) -> int | None:
        """The server's pid (it leads its own process group), while this object runs it."""
        return self._child.pid if self._child is not None else None

    def is_running(self) -> bool:
        return self._child is not None and self._child.alive()

    def start(self) -> str:
        if self.is_running():
            return self.endpoint_url
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DevstackError(f"cannot create {self.base_dir}: {exc}") from exc
        if self._wanted == "localstack":
            port = self._requested_port or free_port()
            try:
                child = self._start_localstack(port)
            except DevstackError as exc:
                log.warning("LocalStack is unavailable, falling back to moto: %s", exc)
                self.fallback_reason = str(exc)
                _FALLBACKS.append(self.fallback_reason)
            else:
                self._child, self._kind, self._port = child, "localstack", port
                return self.endpoint_url
        port = self._requested_port or free_port()
        self._child, self._kind, self._port = self._start_moto(port), "moto", port
        return self.endpoint_url

    def stop(self, timeout: float = 10.0) -> None:
        if self._child is not None:
            self._child.stop_group(sig=signal.SIGTERM, timeout=timeout)
            self._child = None

    def __enter__(self) -> LocalSqs:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- servers ----------------------------------------------------------------------------

    def _start_localstack(self, port: int) -> Child:
        python = ensure_localstack_venv(self.localstack_venv, uv=self.uv)
        root = self.base_dir / "localstack"
        (root / "home").mkdir(parents=True, exist_ok=True)
        env = _server_env(root / "home")
        env.update(
            GATEWAY_LISTEN=f"127.0.0.1:{port}",
            LOCALSTACK_HOST=f"127.0.0.1:{port}",
            # SQS for the stack; STS, S3 and IAM for the credential broker (LocalStack does not
            # enforce IAM: tests assert the session policy documents themselves).
            SERVICES="sqs,sts,s3,iam",
            EAGER_SERVICE_LOADING="1",
            SQS_ENDPOINT_STRATEGY="off",  # queue URLs http://127.0.0.1:<port>/<account>/<name>
            DNS_ADDRESS="0",
            SKIP_SSL_CERT_DOWNLOAD="1",
            DISABLE_EVENTS="1",
            FILESYSTEM_ROOT=str(root / "fs"),
        )
        argv = [str(python), "-m", "localstack.runtime.main"]
        return self._launch("localstack", argv, env, port, cwd=root)

    def _start_moto(self, port: int) -> Child:
        if importlib.util.find_spec("moto") and importlib.util.find_spec("flask_cors"):
            python = Path(sys.executable)  # moto[server] is installed here already
        else:
            python = ensure_moto_venv(self.localstack_venv, uv=self.uv)
        root = self.base_dir / "moto"
        (root / "home").mkdir(parents=True, exist_ok=True)
        argv = [str(python), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        return self._launch("moto", argv, _server_env(root / "home"), port, cwd=root)

    def _launch(
        self, name: str, argv: list[str], env: dict[str, str], port: int, cwd: Path
    ) -> Child:
        child = spawn(
            name,
            argv,
            log_path=self.log_path,
            env=env,
            cwd=cwd,
            die_with_parent=self.die_with_parent,
        )
        probe = sqs_client(f"http://127.0.0.1:{port}", config=_PROBE_CONFIG)

        def answers() -> bool:
            try:
                probe.list_queues()
            except Exception:  # not listening yet, or still booting: any failure means "not yet"
                return False
            return True

        try:
            wait_until(answers, child=child, timeout=self.start_timeout, interval=0.1)
        except BaseException:
            child.stop_group(timeout=10.0)
            raise
        finally:
            probe.close()
        return child
