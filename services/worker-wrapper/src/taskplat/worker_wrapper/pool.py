"""Pooled operators: long-lived processes that serve one task at a time each (for operators that
start slowly).

Invariants:
  * A pool has `pool_size` slots; a task takes a free slot (waiting for one counts against its
    deadline and yields to a stop), starting the slot's process if it has none or it died.
  * A task takes the most recently freed slot: an idle live process is always taken before a slot
    without one, so a pool starts a process only when every started one is busy. A free slot is
    taken without yielding to the event loop, so a live process gets the task's line in the
    same turn as the claim's answer, ahead of whatever else the answer started.
  * `warm()`, called before the wrapper takes work, starts the operator's `warm` processes
    (by default the whole pool) at once; one that fails to start leaves its slot to start on
    first use.
  * A pooled process reads one task JSON per line on stdin and answers each with event lines then
    one envelope line. It has no per-task environment: the task line carries `task_id`, `attempt`,
    `lease_token` and `deadline_at`.
  * A process that crashed, was killed (deadline, stop) or broke the protocol (flood, malformed
    line, stdout closed) is retired (its group killed) and its slot restarts on next use; a
    process that answered, whatever the status, is kept.
  * `close()` kills every process of the pool, all at once (a stop waits one kill grace).
  * Each process start is counted; each task handed to a process is logged (`operator_started`,
    with `reused`); kills are counted and logged with their reason; a process that died or
    closed stdout before answering (also while idle) is counted as a crash.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable, Mapping

from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.isolation import Isolation
from taskplat.worker_wrapper.observability import WrapperTelemetry
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import (
    Abort,
    OperatorRunner,
    RunOutcome,
    TaskInput,
    failure,
)
from taskplat.worker_wrapper.process import (
    OperatorProcess,
    describe_exit,
    dispose,
    drain_input,
    kill_group,
    offer_input,
    signal_group,
    wait_exit,
)
from taskplat.worker_wrapper.protocol import (
    Answer,
    EndOfOutput,
    EventSink,
    ProtocolError,
    StdoutBudget,
    read_answer,
)
from taskplat.worker_wrapper.racing import cancel_and_wait, deadline_message, race
from taskplat.worker_wrapper.runner import (
    STDERR_SETTLE_SECONDS,
    OperatorProcesses,
    PerTaskRunner,
    RunnerLimits,
    envelope_outcome,
    kill_reason,
    protocol_kill_reason,
    record_kill,
)


class PooledRunner(OperatorProcesses):
    def __init__(
        self,
        name: str,
        spec: OperatorSpec,
        limits: RunnerLimits,
        environ: Mapping[str, str],
        telemetry: WrapperTelemetry | None = None,
    ) -> None:
        super().__init__(name, spec, limits, environ, telemetry)
        # Last in, first out: a freed process goes back on top, above the slots never started.
        self._slots: asyncio.LifoQueue[OperatorProcess | None] = asyncio.LifoQueue()
        for _ in range(spec.processes):
            self._slots.put_nowait(None)
        self._live: set[OperatorProcess] = set()
        self.started = 0  # processes started so far (observability and tests)

    async def run(
        self, task: TaskInput, *, deadline: float | None, forward: EventSink, abort: Abort
    ) -> RunOutcome:
        loop = asyncio.get_running_loop()
        if abort.is_set:
            return abort.stopped()
        if not self._slots.empty():  # a free slot: take it now, the task's input goes out
            slot = self._slots.get_nowait()  # before this event-loop turn ends
        else:
            waited_from = loop.time()
            take = asyncio.ensure_future(self._slots.get())
            finish = await race(take, abort, deadline)
            if finish != "done":
                take.cancel()
                if take.done() and not take.cancelled():
                    self._slots.put_nowait(take.result())
                if finish == "stopped":
                    return abort.stopped()
                return failure(
                    deadline_message(loop.time() - waited_from)
                    + " (no free process of the pooled operator)"
                )
            slot = take.result()
        keep: OperatorProcess | None = None
        try:
            reused = slot is not None and slot.alive
            if slot is None or not slot.alive:
                if slot is not None:  # it died while idle
                    self._telemetry.operator_crashed(self._name)
                    await self._retire(slot)
                try:
                    slot = await self._start()
                except OSError as exc:
                    return failure(f"cannot start operator {self._name!r}: {exc}")
            outcome, healthy = await self._serve(slot, task, deadline, forward, abort, reused)
            if healthy:
                keep = slot
            else:
                await self._retire(slot)
            return outcome
        finally:
            if keep is None and slot is not None and slot in self._live:
                signal_group(slot.proc.pid, signal.SIGKILL)
                self._live.discard(slot)
            self._slots.put_nowait(keep)

    async def warm(self) -> None:
        count = min(self._spec.warm, self._slots.qsize())
        if count == 0:
            return
        taken = [self._slots.get_nowait() for _ in range(count)]
        started = await asyncio.gather(*(self._start() for _ in taken), return_exceptions=True)
        for slot, result in zip(taken, started, strict=True):
            if isinstance(result, OperatorProcess):
                self._slots.put_nowait(result)
                continue
            if not isinstance(result, OSError):
                raise result
            get_logger().warning(
                "pooled_operator_warm_failed", operator=self._name, error=str(result)
            )
            self._slots.put_nowait(slot)

    async def _start(self) -> OperatorProcess:
        slot = await self._start_process()
        self._live.add(slot)
        self.started += 1
        get_logger().info("pooled_operator_started", operator=self._name, pid=slot.proc.pid)
        return slot

    async def _retire(self, slot: OperatorProcess) -> None:
        self._live.discard(slot)
        await kill_group(slot.proc, self._limits.kill_grace_seconds)
        await dispose(slot.proc, slot.stderr)

    async def _serve(
        self,
        slot: OperatorProcess,
        task: TaskInput,
        deadline: float | None,
        forward: EventSink,
        abort: Abort,
        reused: bool,
    ) -> tuple[RunOutcome, bool]:
        """Serve one task on `slot`; also say whether the process may serve the next one."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        mark = slot.stderr.mark()
        offered = offer_input(slot.proc, task.line())  # now, not when the session first runs
        get_logger().info(
            "operator_started",
            operator=self._name,
            mode=self._spec.mode,
            pid=slot.proc.pid,
            reused=reused,
        )
        session = asyncio.ensure_future(self._session(slot, offered, forward))
        try:
            finish = await race(session, abort, deadline)
            if finish != "done":
                record_kill(self._telemetry, self._name, kill_reason(finish, abort), slot.proc.pid)
                await kill_group(slot.proc, self._limits.kill_grace_seconds)
                if finish == "stopped":
                    return abort.stopped(), False
                await slot.stderr.settle(STDERR_SETTLE_SECONDS)
                return failure(
                    deadline_message(loop.time() - started), slot.stderr.text(mark)
                ), False
            answer = session.result()
            if isinstance(answer, ProtocolError | EndOfOutput):
                if isinstance(answer, EndOfOutput):  # give it a moment to exit by itself
                    self._telemetry.operator_crashed(self._name)
                    await wait_exit(slot.proc, self._limits.kill_grace_seconds)
                else:
                    kill = protocol_kill_reason(answer)
                    record_kill(self._telemetry, self._name, kill, slot.proc.pid, answer.message)
                exit_text = describe_exit(slot.proc.returncode)
                await kill_group(slot.proc, self._limits.kill_grace_seconds)
                await slot.stderr.settle(STDERR_SETTLE_SECONDS)
                if isinstance(answer, ProtocolError):
                    reason = answer.message
                else:
                    reason = f"operator {exit_text} before answering"
                return failure(reason, slot.stderr.text(mark)), False
            await asyncio.sleep(0)  # let stderr written with the answer arrive
            return envelope_outcome(answer, None, slot.stderr.text(mark)), True
        finally:
            await cancel_and_wait(session)

    async def _session(self, slot: OperatorProcess, offered: bool, forward: EventSink) -> Answer:
        assert slot.proc.stdout is not None
        if not offered or not await drain_input(slot.proc, close=False):
            return EndOfOutput()
        return await read_answer(slot.proc.stdout, StdoutBudget(self._limits.stdout), forward)

    async def close(self) -> None:
        # All at once: one after the other, a pool whose processes wait out the kill grace
        # would take `pool_size` graces to stop.
        await asyncio.gather(*(self._retire(slot) for slot in list(self._live)))


def build_runners(
    specs: Mapping[str, OperatorSpec],
    limits: RunnerLimits,
    environ: Mapping[str, str],
    telemetry: WrapperTelemetry | None = None,
    isolation: Isolation | None = None,
) -> dict[str, OperatorRunner]:
    """One runner per configured operator: per-task or pooled, as its spec says (`isolation`:
    how per-task runners separate untrusted tasks)."""
    runners: dict[str, OperatorRunner] = {}
    for name, spec in specs.items():
        if spec.mode == "pooled":
            runners[name] = PooledRunner(name, spec, limits, environ, telemetry)
        else:
            runners[name] = PerTaskRunner(name, spec, limits, environ, telemetry, isolation)
    return runners


async def warm_operators(runners: Iterable[OperatorRunner]) -> None:
    """Start every runner's warm processes at once (the wrapper does so before taking work, so
    a pooled operator's first tasks do not wait for its processes to start)."""
    await asyncio.gather(*(runner.warm() for runner in runners))
