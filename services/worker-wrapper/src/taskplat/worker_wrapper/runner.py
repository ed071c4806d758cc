"""Per-task operators: a fresh child process for each task (the mode for untrusted code).

Invariants:
  * The operator starts only if the task was not already stopped and its deadline has not passed.
  * The task JSON is written to stdin as one line, then stdin is closed. Event lines are forwarded
    as they are read, in order; the first result envelope ends the answer (later output is
    discarded, still under the flood cap).
  * When the leader exits, the rest of its process group is killed at once: a per-task operator
    lives exactly as long as its leader, and a grandchild holding stdout cannot stall the task.
  * At the deadline or on a stop, the whole group is killed (SIGTERM, SIGKILL after the grace);
    whatever happens, including cancellation of `run`, the group gets SIGKILL before `run` returns.
  * Success needs a `succeeded` envelope and exit code 0; anything else is a failure naming the
    reason, with the tail of stderr.
  * An untrusted task (its operator says `untrusted: true`, or its claim `trust: untrusted`) runs
    in a scratch directory of its own (its cwd, HOME and TMPDIR; removed afterwards) and, where
    the wrapper can switch users, as the operator user.
  * Each process started is counted and logged (`operator_started`); each kill is counted and
    logged with its reason (`operator_killed`: deadline, a stop reason, or a protocol error);
    an exit without an envelope or a non-zero exit is counted as a crash.
"""

from __future__ import annotations

import asyncio
import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.isolation import (
    Isolation,
    OperatorIdentity,
    make_scratch_dir,
    remove_scratch_dir,
)
from taskplat.worker_wrapper.observability import KillReason, WrapperTelemetry
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import (
    Abort,
    RunOutcome,
    Succeeded,
    TaskInput,
    failure,
)
from taskplat.worker_wrapper.process import (
    OperatorProcess,
    Process,
    describe_exit,
    dispose,
    kill_group,
    signal_group,
    start_operator,
    wait_exit,
    write_input,
)
from taskplat.worker_wrapper.protocol import (
    Answer,
    EndOfOutput,
    EventSink,
    ProtocolError,
    ResultEnvelope,
    StdoutBudget,
    StdoutLimits,
    discard_until_eof,
    read_answer,
)
from taskplat.worker_wrapper.racing import Finish, cancel_and_wait, deadline_message, race

STDERR_SETTLE_SECONDS = 1.0


@dataclass(frozen=True)
class RunnerLimits:
    stdout: StdoutLimits
    stderr_tail_bytes: int
    kill_grace_seconds: float


def kill_reason(finish: Finish, abort: Abort) -> KillReason:
    """Why a race that did not finish killed the operator: its stop reason, or the deadline."""
    if finish == "stopped" and abort.reason is not None:
        return abort.reason
    return "deadline"


def protocol_kill_reason(error: ProtocolError) -> KillReason:
    return "flood" if error.message.startswith("stdout flood") else "protocol_error"


def record_kill(
    telemetry: WrapperTelemetry, operator: str, reason: KillReason, pid: int, detail: str = ""
) -> None:
    telemetry.operator_killed(operator, reason)
    log = get_logger()
    log.warning("operator_killed", operator=operator, reason=reason, pid=pid, detail=detail)


def envelope_outcome(envelope: ResultEnvelope, returncode: int | None, stderr: str) -> RunOutcome:
    """The outcome of a task answered by `envelope` (returncode None: the process lives on)."""
    exited_badly = returncode is not None and returncode != 0
    if not envelope.succeeded:
        reason = f"operator reported status {envelope.status!r}"
        if envelope.error:
            reason += f": {envelope.error}"
        if exited_badly:
            reason += f" (and {describe_exit(returncode)})"
        return replace(failure(reason, stderr), retryable=envelope.retryable)
    if exited_badly:
        return failure(f"operator {describe_exit(returncode)} after a succeeded result", stderr)
    return Succeeded(envelope.payload, tuple(envelope.outputs), tuple(envelope.events))


class OperatorProcesses:
    """What the per-task and the pooled runner share: how one operator's processes start (its
    environment from `environ`, its limits, the telemetry that counts them)."""

    def __init__(
        self,
        name: str,
        spec: OperatorSpec,
        limits: RunnerLimits,
        environ: Mapping[str, str],
        telemetry: WrapperTelemetry | None = None,
    ) -> None:
        self._name = name
        self._spec = spec
        self._limits = limits
        self._environ = environ
        self._telemetry = telemetry or WrapperTelemetry()

    async def _start_process(
        self,
        task_vars: Mapping[str, str] | None = None,
        identity: OperatorIdentity | None = None,
        scratch: Path | None = None,
    ) -> OperatorProcess:
        """Start one process of the operator (see `start_operator`); raises OSError."""
        return await start_operator(
            self._name,
            self._spec,
            self._environ,
            line_limit=self._limits.stdout.line_max_bytes,
            stderr_tail_bytes=self._limits.stderr_tail_bytes,
            telemetry=self._telemetry,
            task_vars=task_vars,
            identity=identity,
            scratch=scratch,
        )


class PerTaskRunner(OperatorProcesses):
    def __init__(
        self,
        name: str,
        spec: OperatorSpec,
        limits: RunnerLimits,
        environ: Mapping[str, str],
        telemetry: WrapperTelemetry | None = None,
        isolation: Isolation | None = None,
    ) -> None:
        super().__init__(name, spec, limits, environ, telemetry)
        self._isolation = isolation or Isolation()

    async def run(
        self, task: TaskInput, *, deadline: float | None, forward: EventSink, abort: Abort
    ) -> RunOutcome:
        if not (self._spec.untrusted or task.untrusted):
            return await self._run(task, deadline, forward, abort, None, None)
        identity = self._isolation.identity
        try:
            scratch = make_scratch_dir(self._isolation.scratch_base, identity)
        except OSError as exc:
            return failure(f"cannot prepare the scratch directory of an untrusted task: {exc}")
        try:
            return await self._run(task, deadline, forward, abort, identity, scratch)
        finally:
            remove_scratch_dir(scratch)

    async def _run(
        self,
        task: TaskInput,
        deadline: float | None,
        forward: EventSink,
        abort: Abort,
        identity: OperatorIdentity | None,
        scratch: Path | None,
    ) -> RunOutcome:
        loop = asyncio.get_running_loop()
        if abort.is_set:
            return abort.stopped()
        if deadline is not None and deadline <= loop.time():
            return failure("deadline passed before the operator started")
        started = loop.time()
        try:
            child = await self._start_process(task.env, identity, scratch)
        except OSError as exc:
            return failure(f"cannot start operator {self._name!r}: {exc}")
        proc, stderr = child.proc, child.stderr
        get_logger().info(
            "operator_started", operator=self._name, mode=self._spec.mode, pid=proc.pid
        )
        session = asyncio.ensure_future(self._session(proc, task, forward))
        try:
            finish = await race(session, abort, deadline)
            if finish != "done":
                record_kill(self._telemetry, self._name, kill_reason(finish, abort), proc.pid)
                await kill_group(proc, self._limits.kill_grace_seconds)
                await cancel_and_wait(session)
                if finish == "stopped":
                    return abort.stopped()
                await stderr.settle(STDERR_SETTLE_SECONDS)
                return failure(deadline_message(loop.time() - started), stderr.text())
            answer = session.result()
            await stderr.settle(STDERR_SETTLE_SECONDS)
            if isinstance(answer, ProtocolError):
                kill = protocol_kill_reason(answer)
                record_kill(self._telemetry, self._name, kill, proc.pid, answer.message)
                return failure(answer.message, stderr.text())
            if isinstance(answer, EndOfOutput) or proc.returncode:
                self._telemetry.operator_crashed(self._name)
            if isinstance(answer, EndOfOutput):
                reason = f"operator {describe_exit(proc.returncode)} without a result envelope"
                return failure(reason, stderr.text())
            return envelope_outcome(answer, proc.returncode, stderr.text())
        finally:
            signal_group(proc.pid, signal.SIGKILL)
            await cancel_and_wait(session)
            await dispose(proc, stderr)

    async def _session(self, proc: Process, task: TaskInput, forward: EventSink) -> Answer:
        """Feed the task, read the answer, wait for the leader to exit."""
        assert proc.stdout is not None
        budget = StdoutBudget(self._limits.stdout)
        writer = asyncio.ensure_future(write_input(proc, task.line(), close=True))
        reaper = asyncio.ensure_future(self._kill_group_on_exit(proc))
        try:
            answer: Answer = await read_answer(proc.stdout, budget, forward)
            if isinstance(answer, ResultEnvelope):
                late = await discard_until_eof(proc.stdout, budget)
                if late is not None:
                    answer = late
            if isinstance(answer, ProtocolError):
                signal_group(proc.pid, signal.SIGKILL)
            await wait_exit(proc, math.inf)
            return answer
        finally:
            await cancel_and_wait(writer)
            await cancel_and_wait(reaper)

    @staticmethod
    async def _kill_group_on_exit(proc: Process) -> None:
        await wait_exit(proc, math.inf)
        signal_group(proc.pid, signal.SIGKILL)

    async def warm(self) -> None:
        return None  # a fresh process per task: nothing runs before the first

    async def close(self) -> None:
        return None
