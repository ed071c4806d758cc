"""`python -m taskplat.worker_wrapper`: non-dumpable -> settings -> secrets out of the environment
-> operators -> logging -> telemetry -> wrapper -> ops server -> signals -> warm pools -> run.

Invariants: only wiring lives here; the process is made non-dumpable before it reads anything,
and the secret variables leave its environment as soon as the settings hold them (see
`isolation`); a bad setting or a bad operators file exits with status 2 and
one line on stderr, never a traceback; SIGTERM/SIGINT start the drain and a drained wrapper
exits 0. The process has one `Telemetry`, created here and passed down; `/metrics` and `/healthz`
are served only when `TASKPLAT_WORKER_OPS_PORT` is set, and spans are flushed before exit. On ECS
(`ECS_AGENT_URI` set) the task is protected from scale-in while it runs attempts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from pydantic import ValidationError

from taskplat.common.logging import get_logger
from taskplat.common.ops_server import start_ops_server
from taskplat.common.process_exit import exit_process
from taskplat.common.service_setup import configure_service
from taskplat.common.telemetry import Telemetry
from taskplat.worker_wrapper.event_loop import EventLoopUnavailable, loop_factory
from taskplat.worker_wrapper.isolation import aws_session, make_non_dumpable, take_secrets
from taskplat.worker_wrapper.observability import SERVICE
from taskplat.worker_wrapper.operators import OperatorsFileError, OperatorSpec, load_operators
from taskplat.worker_wrapper.pool import warm_operators
from taskplat.worker_wrapper.settings import WrapperSettings, describe_settings_error
from taskplat.worker_wrapper.task_protection import TaskProtection
from taskplat.worker_wrapper.worker import build_wrapper

PROG = "taskplat-worker-wrapper"


async def serve(
    settings: WrapperSettings,
    specs: Mapping[str, OperatorSpec],
    telemetry: Telemetry,
    session: Any = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(sig: signal.Signals) -> None:
        get_logger().info("stop_requested", signal=sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop, sig)
    wrapper = build_wrapper(settings, specs, telemetry=telemetry, aws=session)
    try:
        ops = start_ops_server(
            settings, telemetry, lambda: wrapper.health.check(settings.stall_seconds)
        )
    except OSError as exc:
        await wrapper.aclose()
        where = f"{settings.ops_host}:{settings.ops_port}"
        raise SystemExit(f"{PROG}: cannot serve /metrics on {where}: {exc.strerror}") from None
    if ops is not None:
        get_logger().info("ops_server_started", host=settings.ops_host, port=ops.port)
    # On ECS, busy tasks are protected from scale-in (task_protection).
    protection = TaskProtection.from_environ(os.environ)
    protecting = None
    if protection is not None:
        wrapper.executor.telemetry.watch_busy(protection.busy_changed)
        protecting = asyncio.create_task(protection.run())
    try:
        await warm_operators(wrapper.runners.values())
        await wrapper.run(stop)
    finally:
        if protection is not None and protecting is not None:
            protection.close()
            await protecting
        await wrapper.aclose()
        if ops is not None:
            ops.stop()


def main() -> int:
    make_non_dumpable()
    try:
        settings = WrapperSettings()
    except ValidationError as exc:
        print(f"{PROG}: invalid settings: {describe_settings_error(exc)}", file=sys.stderr)
        return 2
    held = take_secrets()
    try:
        specs = load_operators(settings.operators_file)
    except OperatorsFileError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(settings.event_loop)
    except EventLoopUnavailable as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    configure_service(SERVICE, settings)
    structlog.contextvars.bind_contextvars(worker_id=settings.worker_id)
    get_logger().info("operators_loaded", operators=sorted(specs))
    telemetry = Telemetry(SERVICE, settings)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(settings, specs, telemetry, aws_session(held, settings.aws_region)))
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    exit_process(main())
