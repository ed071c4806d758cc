"""TurnBatcher, the one batching rule of the wrapper's completions and deletions: items of one
loop turn go together, at most `max_batch` per send and `parallel` sends in flight; each submitter
gets its own result; a failing send leaves no one waiting. Pure asyncio: the send is a recorder."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence

import pytest

from taskplat.worker_wrapper.turn_batching import TurnBatcher

caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")


class Recorder:
    """A send that records its batches and the context it ran in; `gate` holds it open."""

    def __init__(self, *, fail_on: int | None = None, short: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.callers: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._fail_on = fail_on
        self._short = short

    async def send(self, items: list[int]) -> Sequence[int | BaseException]:
        self.batches.append(list(items))
        self.callers.append(caller.get())
        await self.gate.wait()
        if self._fail_on in items:
            raise OSError(f"send of {items} failed")
        results: list[int | BaseException] = [
            ValueError(item) if item < 0 else item * 10 for item in items
        ]
        return results[:-1] if self._short else results


async def _submit_as(batcher: TurnBatcher[int, int], item: int) -> int:
    caller.set(f"caller-{item}")
    return await batcher.submit(item)


def test_items_of_one_turn_go_together_each_with_its_own_result() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        batcher = TurnBatcher(recorder.send, max_batch=10, parallel=4)
        results = await asyncio.gather(
            *(_submit_as(batcher, n) for n in (1, 2, -3)), return_exceptions=True
        )
        assert recorder.batches == [[1, 2, -3]]
        assert results[:2] == [10, 20]
        assert isinstance(results[2], ValueError)
        # A batch of several is no one's child; a lone item runs in its submitter's context.
        assert recorder.callers == ["none"]
        assert await _submit_as(batcher, 7) == 70
        assert recorder.batches[-1] == [7]
        assert recorder.callers[-1] == "caller-7"

    asyncio.run(scenario())


def test_sends_hold_at_most_max_batch_and_parallel_bounds_those_in_flight() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        recorder.gate.clear()
        batcher = TurnBatcher(recorder.send, max_batch=3, parallel=2)
        first = [asyncio.ensure_future(batcher.submit(n)) for n in range(8)]
        await _until(lambda: len(recorder.batches) == 2)
        assert recorder.batches == [[0, 1, 2], [3, 4, 5]]  # 6 and 7 wait: two sends in flight
        later = [asyncio.ensure_future(batcher.submit(n)) for n in (8, 9)]
        await asyncio.sleep(0)
        assert len(recorder.batches) == 2
        recorder.gate.set()
        assert await asyncio.gather(*first, *later) == [n * 10 for n in range(10)]
        # Those that piled up went together as sends returned: the first return freed one slot.
        assert recorder.batches[2:] == [[6, 7, 8], [9]]

    asyncio.run(scenario())


@pytest.mark.parametrize("failure", ["raises", "answers-too-few"])
def test_a_failing_send_hands_its_error_to_every_submitter(failure: str) -> None:
    async def scenario() -> None:
        recorder = Recorder(fail_on=2) if failure == "raises" else Recorder(short=True)
        batcher = TurnBatcher(recorder.send, max_batch=10, parallel=1)
        results = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(n) for n in (1, 2, 3)), return_exceptions=True),
            timeout=5,
        )
        assert all(isinstance(result, Exception) for result in results), results
        if failure == "raises":  # the batcher goes on after a failed send
            assert await batcher.submit(5) == 50

    asyncio.run(scenario())


def test_an_item_whose_submitter_left_before_its_send_is_dropped() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        recorder.gate.clear()
        batcher = TurnBatcher(recorder.send, max_batch=10, parallel=1)
        busy = asyncio.ensure_future(batcher.submit(1))
        await _until(lambda: len(recorder.batches) == 1)
        left = asyncio.ensure_future(batcher.submit(2))
        stays = asyncio.ensure_future(batcher.submit(3))
        await asyncio.sleep(0)
        left.cancel()
        recorder.gate.set()
        assert await busy == 10
        assert await stays == 30
        assert recorder.batches == [[1], [3]]

    asyncio.run(scenario())


async def _until(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


def test_with_a_linger_items_of_later_turns_join_and_a_full_batch_goes_at_once() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        batcher = TurnBatcher(recorder.send, max_batch=3, parallel=4, linger_seconds=0.2)

        async def later(item: int, delay: float) -> int:
            await asyncio.sleep(delay)
            return await batcher.submit(item)

        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.gather(later(1, 0), later(2, 0.02)) == [10, 20]
        assert recorder.batches == [[1, 2]], "the second turn's item joined the first's send"
        assert loop.time() - started >= 0.2
        started = loop.time()
        assert await asyncio.gather(*(later(n, 0.01 * n) for n in (4, 5, 6))) == [40, 50, 60]
        assert recorder.batches[-1] == [4, 5, 6]
        assert loop.time() - started < 0.15, "a full batch does not wait for the linger"

    asyncio.run(scenario())


def test_a_lingering_batch_goes_as_soon_as_ready_says_no_other_will_come() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        expected = 3  # e.g. the tasks the wrapper is running
        batcher = TurnBatcher(
            recorder.send,
            max_batch=10,
            parallel=4,
            linger_seconds=3600,  # never reached: `ready` sends it
            ready=lambda waiting, sent: waiting + sent >= expected,
        )
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)  # one item of three: it lingers
        assert recorder.batches == [] and not first.done()
        later = [asyncio.ensure_future(batcher.submit(n)) for n in (2, 3)]
        results = await asyncio.wait_for(asyncio.gather(first, *later), timeout=10)
        assert results == [10, 20, 30]
        assert recorder.batches == [[1, 2, 3]]
        expected = 1  # a lone item never waits for the linger
        assert await asyncio.wait_for(batcher.submit(4), timeout=10) == 40

    asyncio.run(scenario())


def test_items_counted_as_sent_make_a_lingering_item_ready() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        recorder.gate.clear()  # the first send stays in flight
        batcher = TurnBatcher(
            recorder.send,
            max_batch=2,
            parallel=4,
            linger_seconds=3600,
            ready=lambda waiting, sent: waiting + sent >= 3,
        )
        full = [asyncio.ensure_future(batcher.submit(n)) for n in (1, 2)]  # a full batch: sent
        await asyncio.sleep(0.05)
        assert recorder.batches == [[1, 2]]
        third = asyncio.ensure_future(batcher.submit(3))  # 1 waiting + 2 in flight: ready
        await asyncio.sleep(0.05)
        assert recorder.batches == [[1, 2], [3]]
        recorder.gate.set()
        assert await asyncio.wait_for(asyncio.gather(*full, third), timeout=10) == [10, 20, 30]

    asyncio.run(scenario())
